"""The closed loop under faults (examples/loop.py's parts as processes): the
trainer killed with SIGKILL mid-run and restarted under its name, the
gateway stopped and started again on its address; the policy still learns,
and no group is trained twice, skipped, or acknowledged without being
trained."""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

from conftest import BIN, example_env

LOOP = pathlib.Path(__file__).resolve().parents[1] / "examples" / "loop.py"
sys.path.insert(0, str(LOOP.parent))
from loop import stop_all, wait_ready  # noqa: E402  (the example's own helpers)


def steps(work):
    path = work / "steps.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Loop:
    def __init__(self, work):
        self.work, self.root, self.procs = work, work / "data", []
        self.env = example_env()

    def start(self, cmd, name):
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(self.work / f"{name}.log", "ab"), env=self.env, start_new_session=True)
        self.procs.append(p)
        return p

    def gateway(self, policy, port):
        ready = self.work / "gateway.ready"
        ready.unlink(missing_ok=True)
        p = self.start([BIN, "gateway", "--upstream", policy, "--to", str(self.root), "--listen", f"127.0.0.1:{port}", "--ready-file", str(ready),
                        "--group-size", "8", "--flush-interval", "200ms", "--groups-per-step", "4", "--max-staleness", "1",
                        "--trainer-poll", "100ms", "--pace-wait", "120s"], "gateway")
        wait_ready(ready, p, "gateway")
        return p

    def trainer(self, policy, serve, kill_at=None):
        cmd = [sys.executable, str(LOOP), "train", "--work", str(self.work), "--policy", policy, "--serve", serve, "--deadline", "240", "--target", "0.9"]
        if kill_at is None:
            return self.start(cmd, "trainer")
        self.env["LOOP_KILL_AT_VERSION"] = str(kill_at)
        try:
            return self.start(cmd, "trainer")
        finally:
            del self.env["LOOP_KILL_AT_VERSION"]

    def wait_steps(self, trainer, n, timeout=120):
        deadline = time.time() + timeout
        while len(steps(self.work)) < n:
            assert trainer.poll() is None, f"trainer exited with {trainer.returncode}: {(self.work / 'trainer.log').read_text()[-2000:]}"
            assert time.time() < deadline, f"{len(steps(self.work))} steps after {timeout}s, want {n}"
            time.sleep(0.05)

    def stop(self):
        stop_all(self.procs)


def sql(root, query):
    out = subprocess.run([BIN, "sql", "--from", str(root), "--format", "jsonl", query], check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_loop_learns_through_a_trainer_crash_and_a_gateway_restart(tmp_path):
    loop = Loop(tmp_path)
    try:
        p = loop.start([sys.executable, str(LOOP), "policy", "--ready", str(tmp_path / "policy.ready")], "policy")
        policy = wait_ready(tmp_path / "policy.ready", p, "policy server")
        port = free_port()
        gateway = loop.gateway(policy, port)
        p = loop.start([BIN, "serve", "--from", str(loop.root), "--listen", "127.0.0.1:0", "--ready-file", str(tmp_path / "serve.ready"),
                        "--layout", "trajectories", "--batch-groups", "4", "--poll", "100ms", "--max-inflight", "2"], "serve")
        serve = "grpc://" + wait_ready(tmp_path / "serve.ready", p, "serve")
        loop.start([sys.executable, str(LOOP), "agents", "--gateway", f"http://127.0.0.1:{port}", "--threads", "16"], "agents")

        # SIGKILL at the worst moment: step 8's weights checkpointed, its
        # batch not acknowledged (redelivered: its groups must not be
        # trained again); then at an arbitrary one.
        trainer = loop.trainer(policy, serve, kill_at=8)
        assert trainer.wait(120) == -signal.SIGKILL, (tmp_path / "trainer.log").read_text()[-2000:]
        trainer = loop.trainer(policy, serve)
        loop.wait_steps(trainer, 15)
        os.killpg(trainer.pid, signal.SIGKILL)
        trainer.wait()
        trainer = loop.trainer(policy, serve)
        loop.wait_steps(trainer, len(steps(tmp_path)) + 10)

        gateway.send_signal(signal.SIGTERM)  # sessions in flight finish or are cut; open groups stay in the WAL
        assert gateway.wait(90) == 0, (tmp_path / "gateway.log").read_text()[-2000:]
        loop.gateway(policy, port)

        assert trainer.wait(240) == 0, f"the loop did not learn: {(tmp_path / 'trainer.log').read_text()[-3000:]}"
        done = steps(tmp_path)
        summary = json.loads((tmp_path / "summary.json").read_text())
        # Every group came through the gateway: each has its age.
        assert summary["freshness"]["groups"] >= sum(s["groups"] for s in done[-5:]) > 0, summary
        assert 0 < summary["freshness"]["p50_ms"] <= summary["freshness"]["p99_ms"] < 60_000, summary
        assert 0 < summary["stall"] < 1, summary
        first = [s["reward"] for s in done[:5]]
        assert sum(first) / len(first) <= 0.3, f"a random policy should score about 0.1: {first}"
    finally:
        loop.stop()

    assert any(s["retrained_skipped"] for s in done), "the batch redelivered after the kill at version 8 was trained again"
    trained = [g for s in done for g in s["trained_groups"]]
    assert len(trained) == len(set(trained)), "a group was trained twice"
    acked = {r["group_id"] for r in sql(loop.root, "select group_id from consumed where consumer_group = 'default'")}
    assert set(trained) == acked, f"trained but not acknowledged: {sorted(set(trained) - acked)[:5]}; acknowledged, never trained: {sorted(acked - set(trained))[:5]}"
    committed = {r["group_id"] for r in sql(loop.root, "select distinct group_id from steps")}
    assert acked <= committed
    # The report's training-loop figures: every train step's groups came
    # through the gateway, so each has an age.
    out = subprocess.run([BIN, "sql", "--from", str(loop.root), "--format", "jsonl", "--report", "training-loop"], check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert sum(r["groups"] for r in rows) == len(acked)
    assert all(r["ack_age_p50_s"] is not None and 0 <= r["ack_age_p50_s"] < 120 for r in rows), rows[:3]
