"""Replay through `rllm-pipe serve`, end to end: a consumer group of two
members trains on merged trajectory batches and acknowledges them; `rllm-pipe
replay --as NEW` makes a group that, consumed through serve again (another
member that stops and resumes, another budget and staleness bound), receives
the same batches byte for byte: the same record bytes, in the same order,
with the same groups."""

import json
import subprocess

import pyarrow as pa
import pytest

from conftest import BIN, Server, run
from rllm_pipe import Client


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("replay")
    src = root / "traces.jsonl"
    run("gen", "--groups", "30", "--group-size", "4", "--turns", "1..6", "--resets", "0.2", "--observation-len", "16",
        "--prompt-len", "32", "--response-len", "16", "--vocab", "300", "--policy-versions", "3", "--seed", "11", "--to", str(src))
    out = root / "out"
    run("ingest", "--from", str(src), "--to", str(out), "--group-size", "4", "--shard-size", "32KiB", "--quiet")
    return out


def record_bytes(rec: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rec.schema) as w:
        w.write_batch(rec)
    return sink.getvalue().to_pybytes()


def drain(location, members, policy_version):
    """Batches in the order they were acknowledged: member i takes
    members[i] batches (None: all that are left), acknowledging each."""
    acked = []
    for name, take in members:
        with Client(location, consumer=name, policy_version=policy_version) as c:
            for b in c.batches():
                acked.append((b.groups, record_bytes(b.record), b.meta.get("layout")))
                assert b.ack()["lost"] == 0
                if take is not None and len(acked) >= take:
                    break
    return acked


def serve(out, group, *flags):
    return Server(out, "--follow=false", "--poll", "50ms", "--consumer-group", group, "--layout", "trajectories", *flags)


def test_replay_through_serve_is_byte_for_byte(runs):
    srv = serve(runs, "orig", "--max-tokens", "3000", "--policy-version", "4")
    try:
        orig = drain(srv.location, [("a", 3), ("b", None)], 4)
    finally:
        srv.stop()
    groups = [g for gs, _, _ in orig for g in gs]
    assert len(orig) >= 6 and len(groups) == len(set(groups)) == 30, "every group once, in several batches"
    assert all(layout == "trajectories" for _, _, layout in orig)

    r = subprocess.run([BIN, "replay", "--from", str(runs), "--consumer-group", "orig", "--to", "again"],
                       check=True, capture_output=True, text=True)
    plan = json.loads(r.stdout)
    assert plan["batches"] == len(orig) and plan["groups"] == 30, plan
    assert plan["layout"] == "trajectories" and plan["original"] == [{"layout": "trajectories", "include_filtered": False}], plan

    # Served as other rows, the replay would not be the original's bytes: refused.
    for rows in (["--layout", "steps"], ["--include-filtered"]):
        with pytest.raises(Exception, match="the group replays orig with --layout trajectories --include-filtered=false"):
            srv = Server(runs, "--follow=false", "--poll", "50ms", "--consumer-group", "again", *rows)
            try:
                drain(srv.location, [("wrong", None)], 9)
            finally:
                srv.stop()

    # Another budget and staleness bound, neither of which applies to a
    # replay; a member that stops after two batches (serve may have read a
    # batch ahead for it) and another member that takes over: it waits for
    # the batch the first one held and receives it first.
    srv = serve(runs, "again", "--max-tokens", "100", "--max-staleness", "0", "--policy-version", "9")
    try:
        again = drain(srv.location, [("c", 2), ("d", None)], 9)
    finally:
        srv.stop()
    assert [gs for gs, _, _ in again] == [gs for gs, _, _ in orig], "the same groups in the same batches, in order"
    for i, ((_, want, _), (_, got, _)) in enumerate(zip(orig, again)):
        assert got == want, f"batch {i}: the record bytes differ"

    # Nothing is left for the replayed group, and the original is settled too.
    for group in ("again", "orig"):
        srv = serve(runs, group)
        try:
            assert drain(srv.location, [("late", None)], 9) == []
        finally:
            srv.stop()
