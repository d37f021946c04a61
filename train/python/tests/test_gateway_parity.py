"""rLLM's own model gateway (PyPI rllm-model-gateway, its SQLite store) and
`rllm-pipe gateway` in front of the same stub backend, driven with identical
sessions by the openai SDK: what each recorded is compared field by field.
Where they differ by design the difference is asserted, not skipped:

- a null logprob entry: rLLM drops it silently and keeps the trace as
  trainable; we keep the null in its place and mark the step
  (metadata.gateway_reject = null_logprob), so that ingest dead-letters it
  wrong_type, as it does the same record from `import rllm` or emit.py;
- /v1/completions: the released rLLM reads prompt ids and logprobs from the
  chat layout only, so it records none; we read vLLM's completions layout;
- streamed tool calls and reasoning: rLLM keeps the raw tool-call deltas and
  drops reasoning deltas; we assemble both into the assistant message.
"""

import json
import subprocess

import openai
import pyarrow.parquet as pq
import pytest

import stub_llm
from conftest import BIN

MODEL = "Qwen/Qwen2.5-7B-Instruct"
QUESTION = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is 6*7?"}]
TOOLS = [{"type": "function", "function": {"name": "python", "parameters": {"type": "object", "properties": {"code": {"type": "string"}}}}}]

SCENARIOS = [
    "vllm_chat",
    "vllm_chat_stream",
    "vllm_chat_tools",
    "vllm_chat_tools_stream",
    "vllm_chat_reasoning",
    "vllm_chat_reasoning_stream",
    "vllm_chat_n2",
    "vllm_completions",
    "vllm_completions_stream",
    "vllm_chat_null_logprob",
    "vllm_chat_stream_null_logprob",
    "vllm_completions_null_logprob",
]


def drive(base_url, name, fixture):
    """One agent call as the fixture's request makes it (without the fields
    the gateway adds), through the openai SDK."""
    c = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)
    h = {"X-Fixture": name}
    req = fixture.request
    stream = fixture.streaming
    if fixture.path == "/v1/completions":
        out = c.completions.create(model=MODEL, prompt=req.get("prompt", "The capital of France is"), stream=stream, extra_headers=h)
    else:
        kw = {"tools": TOOLS} if "tools" in name else {}
        if req.get("n"):
            kw["n"] = req["n"]
        out = c.chat.completions.create(model=MODEL, messages=QUESTION, stream=stream, extra_headers=h, **kw)
    if stream:
        list(out)


@pytest.fixture
def both(gateway, rllm_gateway, llm):
    ours = gateway("--group-size", "1")
    return rllm_gateway, ours


def sid_of(rec):
    """The session id of one of our records (trajectory ids are {session_id}@{incarnation})."""
    return rec["trajectory_id"].rsplit("@", 1)[0]


def session(name):
    return f"{name.replace('_', '-')}:0"


def test_recorded_calls_field_by_field(both, llm, tmp_path):
    rllm, ours = both
    for name in SCENARIOS:
        fx = llm.fixtures[name]
        drive(f"{rllm.url}/sessions/{session(name)}/v1", name, fx)
        drive(ours.session_url(session(name)), name, fx)
    calls = llm.wait_completed(2 * len(SCENARIOS))
    assert len(calls) == 2 * len(SCENARIOS)
    for name in SCENARIOS:
        ours.finish(session(name), reward=1.0, is_correct=True, termination_reason="env_done")

    rejected = {}
    for name in SCENARIOS:
        fx = llm.fixtures[name]
        sid = session(name)
        # The stub answered both gateways the same bytes.
        a, b = [c for c in calls if c.fixture == name]
        assert a.sent == b.sent
        exp = stub_llm.expected(a)
        traces = rllm.traces(sid)
        steps = sorted((r for r in ours.records() if r.get("type") == "step" and sid_of(r) == sid), key=lambda r: r["step_index"])
        assert len(traces) == 1 and len(steps) == 1, name
        t, s = traces[0], steps[0]

        # Both send the upstream what it needs for training.
        for c in (a, b):
            assert stub_llm.wants_token_ids(c.request) and stub_llm.wants_logprobs(c.request), name

        assert s["response_ids"] == t["completion_token_ids"] == fx.expect["response_ids"], name
        assert s["finish_reason"] == t["finish_reason"] == fx.expect["finish_reason"], name
        assert s["model"] == t["model"] == MODEL, name
        assert s["policy_version"] == 0

        chat = fx.path == "/v1/chat/completions"
        nulls = fx.expect.get("null_logprob_positions")
        non_null = [x for x in exp["logprobs"] if x is not None]
        if chat:
            assert s["prompt_ids"] == t["prompt_token_ids"] == fx.expect["prompt_ids"], name
            assert (t["logprobs"] or []) == pytest.approx(non_null), name
        else:
            # Released rLLM: no prompt ids, no logprobs from /v1/completions.
            assert s["prompt_ids"] == fx.expect["prompt_ids"], name
            assert t["prompt_token_ids"] == [] and not t["logprobs"], name
        if nulls:
            # rLLM shortens the list; ours keeps the nulls in place and says so.
            assert len(s["response_logprobs"]) == len(s["response_ids"]), name
            assert [i for i, x in enumerate(s["response_logprobs"]) if x is None] == nulls, name
            assert [x for x in s["response_logprobs"] if x is not None] == pytest.approx(non_null), name
            assert s["metadata"]["gateway_reject"] == "null_logprob", name
            assert "gateway_reject" not in (t.get("metadata") or {}), name
            rejected[s["step_id"]] = name
        else:
            assert s["response_logprobs"] == pytest.approx(non_null), name
            assert s["response_logprobs"] == pytest.approx(fx.expect["response_logprobs"]), name
            assert "gateway_reject" not in (s.get("metadata") or {}), name

        if chat:
            assert s["messages"][:-1] == t["messages"] == QUESTION, name
            mine, theirs = s["messages"][-1], t["response_message"]
            want = fx.expect.get("response_message") or exp["message"]
            assert mine.get("content") == theirs.get("content") == want.get("content"), name
            if want.get("tool_calls"):
                assert mine["tool_calls"] == want["tool_calls"], name
                if fx.streaming:
                    assert theirs["tool_calls"] != want["tool_calls"], name  # raw deltas
                else:
                    assert theirs["tool_calls"] == want["tool_calls"], name
            if want.get("reasoning_content"):
                assert mine["reasoning_content"] == want["reasoning_content"], name
                if fx.streaming:
                    assert not theirs.get("reasoning_content"), name
                else:
                    assert theirs["reasoning_content"] == want["reasoning_content"], name

    # Our record log through ingest: the marked steps are dead letters with
    # wrong_type; every other call is in a committed shard once.
    out = tmp_path / "shards"
    subprocess.run([BIN, "ingest", "--from", str(ours.log), "--to", str(out), "--group-size", "1", "--quiet"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dead = {}
    for p in (out / "_dlq").glob("*.jsonl"):
        for line in p.read_text().splitlines():
            d = json.loads(line)
            rec = d.get("record")
            rec = json.loads(rec) if isinstance(rec, str) else rec
            if isinstance(rec, dict) and rec.get("type") == "step":
                dead[rec["step_id"]] = d["reason"]
    assert dead == {sid: "wrong_type" for sid in rejected}
    with open(out / "_manifest" / "shards.jsonl") as f:
        paths = [json.loads(line)["path"] for line in f if json.loads(line).get("path")]
    rows = []
    for p in paths:
        rows.extend(pq.read_table(out / p, columns=["trajectory_id", "response_ids"]).to_pylist())
    want = {session(n) for n in SCENARIOS if not llm.fixtures[n].expect.get("null_logprob_positions")}
    assert sorted(sid_of(r) for r in rows) == sorted(want)
    for r in rows:
        name = next(n for n in SCENARIOS if session(n) == sid_of(r))
        assert r["response_ids"] == llm.fixtures[name].expect["response_ids"]
