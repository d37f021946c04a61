"""Fixtures: a real rllm-pipe binary generates traces, ingests them into
shards, and serves them over Arrow Flight (RLLM_PIPE_BIN, default
bin/rllm-pipe at the repository root, built by `make test`)."""

import json
import os
import pathlib
import subprocess
import time

import pyarrow.parquet as pq
import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
BIN = os.environ.get("RLLM_PIPE_BIN", str(REPO / "bin" / "rllm-pipe"))


def run(*args):
    subprocess.run([BIN, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.fixture(scope="session")
def shards(tmp_path_factory):
    """An ingest output root with many small shards over four policy versions."""
    root = tmp_path_factory.mktemp("shards")
    src = root / "traces.jsonl"
    run("gen", "--groups", "120", "--group-size", "4", "--out", str(src))
    out = root / "out"
    run("ingest", "--from", str(src), "--to", str(out), "--group-size", "4", "--shard-size", "256KiB", "--quiet")
    return out


def committed_groups(out):
    """group_id -> (group_version, tokens) read independently with pyarrow from
    the shards the manifest lists."""
    groups = {}
    with open(out / "_manifest" / "shards.jsonl") as f:
        paths = [json.loads(line)["path"] for line in f if json.loads(line).get("path")]
    for p in paths:
        t = pq.read_table(out / p, columns=["group_id", "group_version", "prompt_ids", "response_ids"])
        for gid, ver, pr, rs in zip(*(t.column(i).to_pylist() for i in range(4))):
            v, n = groups.get(gid, (ver, 0))
            groups[gid] = (v, n + len(pr) + len(rs))
    return groups


class Server:
    def __init__(self, out, *flags, env=None):
        self.ready = out.parent / f"ready-{time.monotonic_ns()}"
        self.proc = subprocess.Popen(
            [BIN, "serve", "--from", str(out), "--listen", "127.0.0.1:0", "--ready-file", str(self.ready), *flags],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=None if env is None else {**os.environ, **env},
        )
        deadline = time.time() + 30
        while not (self.ready.exists() and self.ready.read_text().strip()):
            if self.proc.poll() is not None:
                raise RuntimeError("serve exited: " + self.proc.stderr.read().decode())
            if time.time() > deadline:
                raise TimeoutError("serve did not start")
            time.sleep(0.05)
        self.location = "grpc://" + self.ready.read_text().strip()

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture
def serve(shards):
    """serve(*flags) starts `rllm-pipe serve` on the shards; stopped at teardown."""
    started = []

    def start(*flags, env=None):
        s = Server(shards, "--follow=false", "--poll", "50ms", *flags, env=env)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()
