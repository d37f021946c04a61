"""pyarrow reads the page encodings the native writer picks by measurement
(DELTA_BINARY_PACKED token ids, front-coded DELTA_BYTE_ARRAY messages):
every step's lists and messages equal those of the JSON input, decoded
independently with Python's json module."""

import json
import struct

import pyarrow.parquet as pq

from conftest import run


def f32(x):
    """x rounded to float32, as the shards store logprobs."""
    return struct.unpack("f", struct.pack("f", x))[0]


def test_new_encodings_read_back_with_pyarrow(tmp_path):
    src = tmp_path / "traces.jsonl"
    # Large enough for pages over the writer's 64 KiB probe threshold.
    run("gen", "--groups", "150", "--group-size", "8", "--seed", "3", "--out", str(src))
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
        t = pf.read(columns=["step_id", "prompt_ids", "response_ids", "response_logprobs", "messages"]).to_pylist()
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
