"""Hand-made multi-turn traces (issue 16): context resets, branches (two
steps extending the same parent), an edited history (the prompt extends,
the messages are rewritten), an empty delta, producer retries (exact
repeats) and shuffled arrival, sent whole and as wire deltas
(parent_step_id + prompt_delta_ids, messages_added). Every step's whole
prompt and messages come back equal to the input through pyarrow
(read_shard) and through the Python client against a real serve."""

import json
import random

import pytest

import pyarrow.parquet as pq

from conftest import Server, run
from rllm_pipe import Client
from rllm_pipe.shards import read_shard


def msg(role, content):
    return {"role": role, "content": content}


def trajectory(traj, task, base):
    """Steps of one trajectory as (record, parent index or None, messages
    extend the parent's). base offsets the token ids per trajectory."""
    head = [msg("system", "You are an agent."), msg("user", f"task {traj}: é ✓")]
    steps = []

    def step(i, prompt, resp, messages, parent=None, msg_ext=True):
        r = {"type": "step", "step_id": f"{traj}#{i}", "task_id": task, "trajectory_id": traj, "step_index": i,
             "policy_version": 1, "prompt_ids": prompt, "response_ids": resp,
             "response_logprobs": [-0.25] * len(resp), "messages": messages}
        steps.append((r, parent, msg_ext))
        return r

    def t(*xs):
        return [base + x for x in xs]

    s0 = step(0, t(1, 2, 3), t(4, 5), head + [msg("assistant", "a0")])
    s1 = step(1, s0["prompt_ids"] + s0["response_ids"] + t(6), t(7),
              s0["messages"] + [msg("tool", "o1"), msg("assistant", "a1")], 0)
    # Two steps extending the same parent (s1): a branch.
    s2 = step(2, s1["prompt_ids"] + s1["response_ids"] + t(8, 9), t(10),
              s1["messages"] + [msg("tool", "o2"), msg("assistant", "a2")], 1)
    s3 = step(3, s1["prompt_ids"] + s1["response_ids"] + t(11), t(12, 13),
              s1["messages"] + [msg("tool", "o3"), msg("assistant", "a3")], 1)
    # An empty delta: the prompt is exactly the parent's prompt + response.
    s4 = step(4, s3["prompt_ids"] + s3["response_ids"], t(14),
              s3["messages"] + [msg("assistant", "a4")], 3)
    # A reset: the task again plus a summary.
    s5 = step(5, t(1, 2, 3, 15), t(16), head + [msg("user", "summary"), msg("assistant", "a5")])
    s6 = step(6, s5["prompt_ids"] + s5["response_ids"] + t(17, 18), t(19),
              s5["messages"] + [msg("tool", "o6"), msg("assistant", "a6")], 5)
    # The prompt extends, the messages were rewritten.
    step(7, s6["prompt_ids"] + s6["response_ids"] + t(20), t(21),
         head + [msg("user", "rewritten"), msg("assistant", "a7")], 6, msg_ext=False)
    return steps


def wire_record(steps, k):
    r, parent, msg_ext = steps[k]
    if parent is None:
        return r
    p = steps[parent][0]
    w = {key: v for key, v in r.items() if key not in ("prompt_ids", "messages")}
    w["parent_step_id"] = p["step_id"]
    w["prompt_delta_ids"] = r["prompt_ids"][len(p["prompt_ids"]) + len(p["response_ids"]):]
    if msg_ext:
        w["messages_added"] = r["messages"][len(p["messages"]):]
    else:
        w["messages"] = r["messages"]
    return w


@pytest.mark.parametrize("wire", [False, True], ids=["whole", "wire"])
def test_multiturn_read_back(tmp_path, wire):
    want, lines = {}, []
    for n, traj in enumerate(["a/r0", "a/r1"]):
        steps = trajectory(traj, "a", 1000 * (n + 1))
        for k, (r, _, _) in enumerate(steps):
            want[r["step_id"]] = (r["prompt_ids"], r["messages"])
            lines.append(json.dumps(wire_record(steps, k) if wire else r))
        lines.append(json.dumps({"type": "trajectory", "trajectory_id": traj, "task_id": "a",
                                 "reward": float(n), "num_steps": len(steps)}))
    rng = random.Random(16)
    lines += rng.sample(lines, 4)  # producer retries: exact repeats
    rng.shuffle(lines)
    src = tmp_path / "traces.jsonl"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    run("ingest", "--from", str(src), "--to", str(out), "--group-size", "2", "--quiet")

    with open(out / "_manifest" / "shards.jsonl") as f:
        paths = [e["path"] for e in map(json.loads, f) if e.get("path")]
    seen, prompt_deltas, msg_deltas = set(), 0, 0
    for p in paths:
        raw = pq.read_table(out / p, columns=["step_id", "prompt_prefix_len", "messages_delta"]).to_pylist()
        prompt_deltas += sum(1 for x in raw if x["prompt_prefix_len"])
        msg_deltas += sum(1 for x in raw if x["messages_delta"] is not None)
        for r in read_shard(out / p, columns=["step_id", "prompt_ids", "messages"]).to_pylist():
            prompt, msgs = want[r["step_id"]]
            assert r["prompt_ids"] == prompt, r["step_id"]
            assert json.loads(r["messages"]) == msgs, r["step_id"]
            assert r["step_id"] not in seen, r["step_id"]
            seen.add(r["step_id"])
    assert seen == set(want)
    # Per trajectory: s1, s2 (predecessor s1), s4 (predecessor s3), s6 and s7
    # are prompt deltas; s3 (a branch of s1) and s5 (a reset) are whole. The
    # messages likewise, but for s7.
    assert (prompt_deltas, msg_deltas) == (10, 8)

    server = Server(out, "--follow=false", "--poll", "50ms")
    try:
        got = set()
        with Client(server.location, consumer="t") as client:
            for batch in client.batches():
                for r in batch.record.to_pylist():
                    prompt, msgs = want[r["step_id"]]
                    assert r["prompt_ids"] == prompt, r["step_id"]
                    assert json.loads(r["messages"]) == msgs, r["step_id"]
                    assert r["step_id"] not in got, r["step_id"]
                    got.add(r["step_id"])
                batch.ack()
        assert got == set(want)
    finally:
        server.stop()
