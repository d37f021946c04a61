"""A stream the server ends with an error is an error for the client, never
an empty stream, also when it ends before the first batch."""
import json

import pyarrow.flight as flight
import pytest

from rllm_pipe import Client

from conftest import Server, run


def test_unreadable_shard_is_an_error_not_an_empty_stream(tmp_path):
    src = tmp_path / "traces.jsonl"
    run("gen", "--groups", "8", "--group-size", "2", "--to", str(src))
    out = tmp_path / "out"
    run("ingest", "--from", str(src), "--to", str(out), "--group-size", "2", "--quiet")
    with open(out / "_manifest" / "shards.jsonl") as f:
        paths = [json.loads(line)["path"] for line in f if json.loads(line).get("path")]
    assert paths
    for p in paths:  # every committed shard damaged: its footer is gone
        data = (out / p).read_bytes()
        (out / p).write_bytes(data[: len(data) // 2])
    srv = Server(out, "--follow=false", "--poll", "50ms")
    try:
        with Client(srv.location, consumer="t0") as c:
            with pytest.raises(flight.FlightError):
                for batch in c.batches():
                    batch.ack()
    finally:
        srv.stop()


def test_nothing_committed_is_an_empty_stream(tmp_path):
    out = tmp_path / "out"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    run("ingest", "--from", str(empty), "--to", str(out), "--quiet")
    srv = Server(out, "--follow=false", "--poll", "50ms")
    try:
        with Client(srv.location, consumer="t0") as c:
            assert list(c.batches()) == []
    finally:
        srv.stop()
