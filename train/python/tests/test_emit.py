"""rllm_pipe.emit: rLLM Episodes (plain dicts and simple objects, no rllm
install) to wire records, posted to a real local HTTP server."""

import http.server
import json
import threading
from types import SimpleNamespace

import pytest

from rllm_pipe.emit import InvalidEpisode, PostError, episode_records, post_records, write_records


def step(sid, prompt, response, logprobs, version=3):
    return {"id": sid, "prompt_ids": prompt, "response_ids": response, "logprobs": logprobs, "reward": 0.5, "done": False,
            "chat_completions": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "weight_version": version}


def episode():
    return {"id": "q1:0", "task": {"id": "other"}, "is_correct": True, "termination_reason": "env_done",
            "trajectories": [{"uid": "u1", "name": "solver", "reward": 1.0, "signals": {"acc": 1.0},
                              "steps": [step("s1", [1, 2], [3, 4], [-0.5, -0.25]), step(None, [1, 2, 3, 4], [5], [-1.0], None)]},
                             {"uid": "", "name": "default_traj_name", "reward": 0.0, "steps": [step("s3", [1], [2], [-0.1])]}]}


def test_dict_episode():
    recs = episode_records(episode(), policy_version=9, group_size=4)
    steps = [r for r in recs if r["type"] == "step"]
    trajs = [r for r in recs if r["type"] == "trajectory"]
    assert [s["step_id"] for s in steps] == ["s1", "u1#1", "s3"]
    assert steps[0]["task_id"] == "q1" and steps[0]["role"] == "solver" and steps[0]["policy_version"] == 3
    assert steps[1]["policy_version"] == 9 and steps[1]["step_index"] == 1
    assert steps[0]["response_logprobs"] == [-0.5, -0.25] and steps[0]["messages"][1]["content"] == "a"
    assert "role" not in steps[2] and steps[2]["trajectory_id"] == "q1:0/1"
    t = trajs[0]
    assert t["trajectory_id"] == "u1" and t["num_steps"] == 2 and t["reward"] == 1.0 and t["is_correct"] is True
    assert t["termination_reason"] == "env_done" and t["group_size"] == 4 and t["signals"] == {"acc": 1.0}


def test_object_episode():
    class Reason:
        value = "max_turns_exceeded"

    mo = SimpleNamespace(prompt_ids=[7, 8], completion_ids=[9], logprobs=[-0.3], weight_version=5, finish_reason="length")
    st = SimpleNamespace(id="x1", prompt_ids=[], response_ids=[], logprobs=[], chat_completions=[], reward=0.0, done=True,
                         weight_version=None, model_output=mo)
    tr = SimpleNamespace(uid="ut", name="agent", reward=0.0, signals={}, steps=[st])
    ep = SimpleNamespace(id="task9", task=None, is_correct=False, termination_reason=Reason(), trajectories=[tr])
    recs = episode_records(ep)
    assert recs[0]["prompt_ids"] == [7, 8] and recs[0]["response_ids"] == [9] and recs[0]["policy_version"] == 5
    assert recs[0]["finish_reason"] == "length" and recs[0]["task_id"] == "task9"
    assert recs[1]["termination_reason"] == "max_turns_exceeded" and recs[1]["is_correct"] is False


@pytest.mark.parametrize("mutate,pv,reason", [
    (lambda e: e["trajectories"][0]["steps"][0].update(logprobs=[-0.5, None]), 1, "wrong_type"),
    (lambda e: e["trajectories"][0]["steps"][0].update(logprobs=[-0.5]), 1, "length_mismatch"),
    (lambda e: None, None, "missing_field"),  # a step without version, none given
    (lambda e: e["trajectories"][0].update(reward=None), 1, "missing_field"),
    (lambda e: e["trajectories"][0].update(reward=float("nan")), 1, "non_finite"),
])
def test_invalid(mutate, pv, reason):
    ep = episode()
    mutate(ep)
    with pytest.raises(InvalidEpisode) as exc:
        episode_records(ep, policy_version=pv)
    assert exc.value.reason == reason


def test_write_records(tmp_path):
    path = tmp_path / "out.jsonl"
    n = write_records(episode_records(episode(), policy_version=1), str(path))
    lines = path.read_text().splitlines()
    assert n == len(lines) == 5 and json.loads(lines[0])["step_id"] == "s1"


def agent_episode():
    """A multi-turn agent: each prompt the conversation so far, a context
    reset at step 3, an edited history at step 5 (the prompt extends, the
    messages are rewritten), an empty delta at step 6."""
    steps, prompt, msgs = [], [1, 2, 3], [{"role": "system", "content": "s"}, {"role": "user", "content": "task é"}]
    for i in range(7):
        if i == 3:  # a reset: a summary replaces the history
            prompt, msgs = [50, 51], [{"role": "user", "content": "summary"}]
        if i == 5:
            msgs = [{"content": "s", "role": "system"}] + msgs[1:]
        resp = [100 + i, 200 + i]
        steps.append({"id": "a%d" % i, "prompt_ids": list(prompt), "response_ids": resp, "logprobs": [-0.5, -0.25],
                      "chat_completions": [dict(m) for m in msgs] + [{"role": "assistant", "content": "act %d" % i}],
                      "weight_version": 2})
        obs = [] if i == 5 else [300 + i, 301 + i]
        prompt = prompt + resp + obs
        msgs = msgs + [{"role": "assistant", "content": "act %d" % i}] + ([{"role": "tool", "content": "obs %d" % i}] if obs else [])
    return {"id": "agent:0", "trajectories": [{"uid": "ta", "reward": 1.0, "steps": steps}]}


def test_deltas_records():
    whole = [r for r in episode_records(agent_episode()) if r["type"] == "step"]
    sent = [r for r in episode_records(agent_episode(), deltas=True) if r["type"] == "step"]
    kinds = ["prompt_ids" if "prompt_ids" in r else "delta:" + r["parent_step_id"] for r in sent]
    assert kinds == ["prompt_ids", "delta:a0", "delta:a1", "prompt_ids", "delta:a3", "delta:a4", "delta:a5"]
    assert sent[1]["prompt_delta_ids"] == [300, 301] and sent[6]["prompt_delta_ids"] == []
    # Messages as added where they extend the parent's as sent: not at the
    # reset, not where the history was rewritten (step 5: same content,
    # other key order).
    assert [("messages_added" in r, "messages" in r) for r in sent] == [
        (False, True), (True, False), (True, False), (False, True), (True, False), (False, True), (True, False)]
    assert sent[1]["messages_added"] == whole[1]["messages"][len(whole[0]["messages"]):]
    assert sum(len(json.dumps(r)) for r in sent) < sum(len(json.dumps(r)) for r in whole)


def test_deltas_store_what_whole_records_store(tmp_path):
    """Both ways through a real ingest: every step reads back (pyarrow,
    whole prompts rebuilt) with the input's prompt and messages, and the
    two outputs hold the same rows."""
    from conftest import run
    from rllm_pipe.shards import read_shard

    ep = agent_episode()
    want = {s["id"]: (s["prompt_ids"], s["chat_completions"]) for s in ep["trajectories"][0]["steps"]}
    tables = []
    for deltas in (False, True):
        src, out = tmp_path / ("in-%s.jsonl" % deltas), tmp_path / ("out-%s" % deltas)
        write_records(episode_records(ep, deltas=deltas), str(src))
        run("ingest", "--from", str(src), "--to", str(out), "--group-size", "1", "--quiet")
        with open(out / "_manifest" / "shards.jsonl") as f:
            paths = [json.loads(line)["path"] for line in f if json.loads(line).get("path")]
        rows = {}
        for p in paths:
            t = read_shard(out / p, columns=["step_id", "prompt_ids", "messages", "prompt_prefix_len"])
            for sid, prompt, msgs, plen in zip(*(t.column(c).to_pylist() for c in ["step_id", "prompt_ids", "messages", "prompt_prefix_len"])):
                rows[sid] = (prompt, json.loads(msgs), plen)
        assert {k: v[:2] for k, v in rows.items()} == want
        tables.append(rows)
    assert tables[0] == tables[1]
    assert sum(1 for v in tables[1].values() if v[2]) == 5  # stored as deltas either way


class _Gateway(http.server.BaseHTTPRequestHandler):
    fail_first = 0
    bodies = []
    auths = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).auths.append(self.headers.get("Authorization"))
        if type(self).fail_first > 0:
            type(self).fail_first -= 1
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b'{"error":"output down"}')
            return
        if self.path != "/records":
            self.send_response(404)
            self.end_headers()
            return
        type(self).bodies.append(body)
        if b"bad" in body:
            self.send_response(400)
            self.end_headers()
            self.wfile.write(b'{"error":"line 1"}')
            return
        self.send_response(200)
        self.end_headers()
        self.wfile.write(json.dumps({"accepted": body.count(b"\n")}).encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def gateway():
    _Gateway.fail_first, _Gateway.bodies, _Gateway.auths = 0, [], []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield "http://127.0.0.1:%d" % srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def test_post_batches_and_retries(gateway, monkeypatch):
    for name in ("RLLM_PIPE_GATEWAY_ADMIN_TOKEN", "RLLM_GATEWAY_ADMIN_TOKEN", "RLLM_GATEWAY_AGENT_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RLLM_PIPE_GATEWAY_AGENT_TOKEN", "s3cret")
    _Gateway.fail_first = 2
    recs = episode_records(episode(), policy_version=1)
    assert post_records(recs, gateway, batch_size=2, backoff=0.01) == 5
    # Three batches stored; the first was sent three times, the same lines.
    assert len(_Gateway.bodies) == 3 and len(_Gateway.auths) == 5
    assert set(_Gateway.auths) == {"Bearer s3cret"}
    sent = [json.loads(l) for b in _Gateway.bodies for l in b.decode().splitlines()]
    assert [r.get("step_id", r.get("trajectory_id")) for r in sent] == ["s1", "u1#1", "u1", "s3", "q1:0/1"]


def test_post_gives_up_and_refuses(gateway):
    _Gateway.fail_first = 10
    with pytest.raises(PostError) as exc:
        post_records(episode_records(episode(), policy_version=1), gateway, token="t", retries=1, backoff=0.01)
    assert exc.value.status == 503
    _Gateway.fail_first = 0
    with pytest.raises(PostError) as exc:
        post_records([{"type": "bad"}], gateway, token="t", backoff=0.01)
    assert exc.value.status == 400 and len(_Gateway.bodies) == 1
