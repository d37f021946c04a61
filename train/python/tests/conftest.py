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
from rllm_pipe.shards import read_shard

REPO = pathlib.Path(__file__).resolve().parents[3]
BIN = os.environ.get("RLLM_PIPE_BIN", str(REPO / "bin" / "rllm-pipe"))


def example_env(**extra):
    """The environment to run an example (train/python/examples) in: the
    examples import rllm_pipe as installed and never touch sys.path, so the
    folder of the rllm_pipe these tests import goes first on PYTHONPATH."""
    import rllm_pipe

    src = str(pathlib.Path(rllm_pipe.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": src + (os.pathsep + path if path else ""), **extra}


def run(*args):
    subprocess.run([BIN, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.fixture(scope="session")
def shards(tmp_path_factory):
    """An ingest output root with many small shards over four policy versions."""
    root = tmp_path_factory.mktemp("shards")
    src = root / "traces.jsonl"
    run("gen", "--groups", "120", "--group-size", "4", "--to", str(src))
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
        t = read_shard(out / p, columns=["group_id", "group_version", "prompt_ids", "response_ids"])
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


# -- the capture gateway (issue 15) ------------------------------------------

import functools  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402

import httpx  # noqa: E402

import stub_llm  # noqa: E402


@pytest.fixture(scope="session")
def stub_backend():
    """The stub LLM backend replaying ingest/gateway/testdata, for the session."""
    with stub_llm.StubLLM() as s:
        yield s


@pytest.fixture
def llm(stub_backend):
    """The session's stub backend with its calls and knobs cleared."""
    stub_backend.reset()
    yield stub_backend
    stub_backend.reset()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, proc, what, timeout=30):
    deadline = time.time() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited: " + (proc.stderr.read().decode() if proc.stderr else ""))
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            raise TimeoutError(f"{what} did not start")
        time.sleep(0.05)


class RLLMGateway:
    """rLLM's own model gateway (the PyPI package rllm-model-gateway) as a
    process on loopback with its SQLite trace store, in front of the stub."""

    def __init__(self, workdir, upstream):
        self.db = workdir / f"rllm-{time.monotonic_ns()}.db"
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rllm_model_gateway", "--host", "127.0.0.1", "--port", str(port), "--worker", upstream,
             "--store", "sqlite", "--db-path", str(self.db), "--log-level", "warning"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        wait_http(self.url + "/health", self.proc, "rllm-model-gateway")

    def traces(self, session_id):
        """The session's traces as rLLM stores them, oldest first."""
        httpx.post(self.url + "/admin/flush", timeout=30).raise_for_status()
        got = httpx.get(f"{self.url}/sessions/{session_id}/traces", timeout=30).json()
        return sorted(got, key=lambda t: t["timestamp"])

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture
def rllm_gateway(tmp_path, llm):
    g = RLLMGateway(tmp_path, llm.url)
    yield g
    g.stop()


@functools.lru_cache(maxsize=None)
def has_gateway_command():
    try:
        return subprocess.run([BIN, "gateway", "--help"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class Gateway:
    """`rllm-pipe gateway` as a process on loopback in front of the stub,
    writing to a record log (JSON lines readable by `rllm-pipe ingest`), or
    to the shard root `to` (the pipeline in-process)."""

    def __init__(self, workdir, upstream, *flags, to=None):
        stamp = time.monotonic_ns()
        self.log = workdir / f"gateway-{stamp}" / "records.jsonl"
        self.log.parent.mkdir()
        self.ready = workdir / f"gateway-ready-{stamp}"
        self.proc = subprocess.Popen(
            [BIN, "gateway", "--listen", "127.0.0.1:0", "--upstream", upstream, "--to", str(to or self.log),
             "--ready-file", str(self.ready), *flags],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.time() + 30
        while not (self.ready.exists() and self.ready.read_text().strip()):
            if self.proc.poll() is not None:
                raise RuntimeError("gateway exited: " + self.proc.stderr.read().decode())
            if time.time() > deadline:
                raise TimeoutError("gateway did not start")
            time.sleep(0.05)
        self.url = "http://" + self.ready.read_text().strip()
        wait_http(self.url + "/health", self.proc, "rllm-pipe gateway")

    def session_url(self, session_id):
        return f"{self.url}/sessions/{session_id}/v1"

    def finish(self, session_id, **body):
        """POST /sessions/{id}/finish: returns once the session's records are durable."""
        r = httpx.post(f"{self.url}/sessions/{session_id}/finish", json=body, timeout=60)
        r.raise_for_status()
        return r.json()

    def records(self):
        """Every record in the log (and any rotated file beside it), in order."""
        out = []
        for p in sorted(self.log.parent.glob("*.jsonl*")):
            with open(p, "rb") as f:
                out.extend(json.loads(line) for line in f if line.strip())
        return out

    @staticmethod
    def _of(record, trajectory_id):
        """A record of trajectory_id, given as the trajectory id or as the
        session id (the gateway names trajectories {session_id}@{run}.{n})."""
        tid = record.get("trajectory_id", "")
        return tid == trajectory_id or tid.rsplit("@", 1)[0] == trajectory_id

    def steps(self, trajectory_id):
        got = [r for r in self.records() if r.get("type") == "step" and self._of(r, trajectory_id)]
        return sorted(got, key=lambda r: r["step_index"])

    def trajectory(self, trajectory_id):
        got = [r for r in self.records() if r.get("type") == "trajectory" and self._of(r, trajectory_id)]
        assert len(got) == 1, f"{len(got)} trajectory records for {trajectory_id}"
        return got[0]

    def stop(self):
        """SIGTERM: in-flight calls finish, the output is flushed; the exit
        status (None if it had to be killed)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        return self.proc.returncode


@pytest.fixture
def gateway(tmp_path, llm):
    """gateway(*flags) starts `rllm-pipe gateway` in front of the stub."""
    if not has_gateway_command():
        pytest.skip("this rllm-pipe has no `gateway` command yet")
    started = []

    def start(*flags, to=None):
        g = Gateway(tmp_path, llm.url, *flags, to=to)
        started.append(g)
        return g

    yield start
    for g in started:
        g.stop()
