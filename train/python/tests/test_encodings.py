"""pyarrow reads the page encodings the native writer picks by measurement
(DELTA_BINARY_PACKED token ids, front-coded DELTA_BYTE_ARRAY messages):
every step's lists and messages equal those of the JSON input, decoded
independently with Python's json module."""

import json
import struct

import pytest

import pyarrow.parquet as pq

from conftest import Server, run
from rllm_pipe import Client
from rllm_pipe.shards import read_shard


def f32(x):
    """x rounded to float32, as the shards store logprobs."""
    return struct.unpack("f", struct.pack("f", x))[0]


def test_new_encodings_read_back_with_pyarrow(tmp_path):
    src = tmp_path / "traces.jsonl"
    # Large enough for pages over the writer's 64 KiB probe threshold.
    run("gen", "--groups", "150", "--group-size", "8", "--seed", "3", "--to", str(src))
    out = tmp_path / "out"
    run("ingest", "--from", str(src), "--to", str(out), "--group-size", "8", "--quiet")

    want = {}
    with open(src) as f:
        for line in f:
            r = json.loads(line)
            if r.get("type") == "step":
                want[r["step_id"]] = (r["prompt_ids"], r["response_ids"], r["response_logprobs"], r.get("messages"))

    encodings, seen = set(), 0
    with open(out / "_manifest" / "shards.jsonl") as f:
        paths = [e["path"] for e in map(json.loads, f) if e.get("path")]
    for p in paths:
        pf = pq.ParquetFile(out / p)
        md = pf.metadata
        for g in range(md.num_row_groups):
            for c in range(md.num_columns):
                col = md.row_group(g).column(c)
                if col.path_in_schema.split(".")[0] in ("response_ids", "messages"):
                    encodings.update(col.encodings)
        t = read_shard(out / p, columns=["step_id", "prompt_ids", "response_ids", "response_logprobs", "messages"]).to_pylist()
        for r in t:
            prompt, resp, lps, msgs = want[r["step_id"]]
            assert r["prompt_ids"] == prompt and r["response_ids"] == resp, r["step_id"]
            assert r["response_logprobs"] == [f32(x) for x in lps], r["step_id"]
            assert (r["messages"] is None) == (msgs is None)
            if msgs is not None:
                assert json.loads(r["messages"]) == msgs, r["step_id"]
            seen += 1
    assert seen == len(want), "every step once"
    assert {"DELTA_BINARY_PACKED", "DELTA_BYTE_ARRAY"} <= encodings, encodings


@pytest.mark.parametrize("tokens", ["random", "text"])
@pytest.mark.parametrize("wire", [False, True], ids=["whole-on-the-wire", "deltas-on-the-wire"])
def test_multi_turn_prompts_read_back(tmp_path, wire, tokens):
    """20-30-turn agents with resets and parallel tool calls, stored as prefix
    deltas (and sent as deltas too), with random token ids and with ids like
    a tokenizer's (gen --tokens text: recurring words, observations seen
    before): every step's whole prompt and messages come back equal to the
    input, read directly with pyarrow (read_shard) and through serve."""
    src = tmp_path / "agents.jsonl"
    shape = ["--groups", "6", "--group-size", "4", "--turns", "20..30", "--prompt-len", "300", "--response-len", "40",
             "--observation-len", "120", "--resets", "0.05", "--parallel-tools", "0.2", "--seed", "5", "--tokens", tokens]
    run("gen", *shape, "--to", str(src))
    sent = src
    if wire:
        sent = tmp_path / "agents-deltas.jsonl"
        run("gen", *shape, "--wire-deltas", "--to", str(sent))
        assert sent.stat().st_size < src.stat().st_size
    out = tmp_path / "out"
    run("ingest", "--from", str(sent), "--to", str(out), "--group-size", "4", "--quiet")
    want = {}
    with open(src) as f:
        for line in f:
            r = json.loads(line)
            if r.get("type") == "step":
                want[r["step_id"]] = (r["prompt_ids"], r.get("messages"))
    with open(out / "_manifest" / "shards.jsonl") as f:
        paths = [e["path"] for e in map(json.loads, f) if e.get("path")]
    seen, deltas = 0, 0
    for p in paths:
        raw = pq.read_table(out / p, columns=["prompt_prefix_len"]).column(0).to_pylist()
        deltas += sum(1 for x in raw if x)
        for r in read_shard(out / p, columns=["step_id", "prompt_ids", "messages"]).to_pylist():
            prompt, msgs = want[r["step_id"]]
            assert r["prompt_ids"] == prompt, r["step_id"]
            assert json.loads(r["messages"]) == msgs, r["step_id"]
            seen += 1
    assert seen == len(want)
    assert deltas > seen // 2, f"only {deltas} of {seen} steps stored as deltas"
    # The delta columns alone come back as stored (nothing is asked whole).
    for cols in (["step_id", "prompt_prefix_len"], ["step_id", "messages_delta"]):
        assert sum(read_shard(out / p, columns=cols).num_rows for p in paths) == seen

    server = Server(out, "--follow=false", "--poll", "50ms")
    try:
        got = 0
        with Client(server.location, consumer="t") as client:
            for batch in client.batches():
                for r in batch.record.to_pylist():
                    prompt, msgs = want[r["step_id"]]
                    assert r["prompt_ids"] == prompt, r["step_id"]
                    assert json.loads(r["messages"]) == msgs, r["step_id"]
                    got += 1
                batch.ack()
        assert got == len(want)
    finally:
        server.stop()
