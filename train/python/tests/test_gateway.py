"""`rllm-pipe gateway` driven by real clients: the openai SDK as the agent
(base_url = http://GATEWAY/sessions/{id}/v1) and rLLM's GatewayClient (the
PyPI package rllm-model-gateway, unchanged) on the session and admin API.
Every recorded Step is compared with what the stub backend returned for
that call, field by field."""

import json
import subprocess
import threading
import time

import httpx
import openai
import pyarrow.parquet as pq
import pytest
from rllm_model_gateway import GatewayClient
from rllm_model_gateway.models import TraceRecord

import stub_llm
from conftest import BIN

MODEL = "Qwen/Qwen2.5-7B-Instruct"
TOOLS = [{"type": "function", "function": {"name": "python", "description": "Run Python code",
                                           "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                                                          "required": ["code"]}}}]
QUESTION = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is 6*7?"}]


def agent(gw, session_id):
    return openai.OpenAI(base_url=gw.session_url(session_id), api_key="unused", max_retries=0, timeout=30)


def fx(name):
    return {"X-Fixture": name}


def sid_of(rec):
    """The session id of a gateway record: trajectory ids are
    {session_id}@{incarnation}, so that a session id used again never
    repeats a step or trajectory id."""
    tid = rec["trajectory_id"]
    assert "@" in tid, tid
    return tid.rsplit("@", 1)[0]


def steps_of(gw, sid):
    got = [r for r in gw.records() if r.get("type") == "step" and sid_of(r) == sid]
    return sorted(got, key=lambda r: r["step_index"])


def trajectory_of(gw, sid):
    got = [r for r in gw.records() if r.get("type") == "trajectory" and sid_of(r) == sid]
    assert len(got) == 1, f"{len(got)} trajectory records for {sid}"
    return got[0]


def set_weight_version(client, version):
    """rLLM's GatewayClient.set_weight_version (newer than the released 0.1.0,
    which has no weight-version call): the same route and body."""
    if hasattr(client, "set_weight_version"):
        return client.set_weight_version(version)
    r = client._http.post(f"{client.gateway_url}/admin/weight_version", json={"weight_version": version})
    r.raise_for_status()
    return r.json()["weight_version"]


def get_weight_version(client):
    r = client._http.get(f"{client.gateway_url}/admin/weight_version")
    r.raise_for_status()
    return r.json().get("weight_version")


def assert_step_matches(step, call, *, chat=True):
    """A Step record against the stub's answer to the call it recorded."""
    exp = stub_llm.expected(call)
    assert step["prompt_ids"] == exp["prompt_ids"]
    assert step["response_ids"] == exp["response_ids"]
    assert step["response_logprobs"] == pytest.approx(exp["logprobs"], rel=1e-6, abs=1e-9)
    assert len(step["response_logprobs"]) == len(step["response_ids"])
    assert step["finish_reason"] == exp["finish_reason"]
    assert step["model"] == exp["model"]
    if not chat:
        return
    assert step["messages"][:-1] == call.request["messages"]
    got = step["messages"][-1]
    assert got["role"] == "assistant"
    for key in ("content", "tool_calls", "reasoning_content"):
        if exp["message"].get(key):
            assert got.get(key) == exp["message"][key], key


def test_agent_session_becomes_steps_and_a_trajectory(gateway, llm):
    """Tools, a tool result turn, streaming, reasoning, completions in one
    session; rewards posted with finish."""
    gw = gateway("--group-size", "1")
    sid = "task-a:0"
    gc = GatewayClient(gw.url)
    assert gc.create_session(session_id=sid) == sid
    c = agent(gw, sid)

    r1 = c.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, extra_headers=fx("vllm_chat_tools"))
    call = r1.choices[0].message.tool_calls[0]
    assert call.function.name == "python" and r1.choices[0].finish_reason == "tool_calls"

    turn2 = QUESTION + [r1.choices[0].message.model_dump(exclude_none=True),
                        {"role": "tool", "tool_call_id": call.id, "content": "42"}]
    raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=turn2, tools=TOOLS, extra_headers=fx("vllm_chat"))
    body = raw.http_response.json()
    # What the agent sees is what vLLM would send it: it asked for neither
    # token ids nor logprobs.
    assert "prompt_token_ids" not in body or body["prompt_token_ids"] is None
    assert body["choices"][0].get("token_ids") is None and body["choices"][0].get("logprobs") is None
    assert raw.parse().choices[0].message.content == "6*7 is 42."

    text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model=MODEL, messages=QUESTION, stream=True, stream_options={"include_usage": True},
        extra_headers=fx("vllm_chat_stream")) if ch.choices)
    assert text == "6*7 is 42."

    reasoning = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model=MODEL, messages=QUESTION, stream=True, extra_headers=fx("vllm_chat_reasoning_stream")) if ch.choices)
    assert reasoning == "42"

    comp = c.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=16, extra_headers=fx("vllm_completions"))
    assert comp.choices[0].text

    done = gw.finish(sid, reward=1.0, is_correct=True, termination_reason="env_done", signals={"accuracy": 1.0})
    assert done is not None
    steps = steps_of(gw, sid)
    calls = llm.wait_completed(5)
    assert [s["step_index"] for s in steps] == [0, 1, 2, 3, 4]
    assert len({s["step_id"] for s in steps}) == 5
    for s, cl in zip(steps, calls):
        assert s["task_id"] == "task-a" and sid_of(s) == sid
        assert s["policy_version"] == 0
        assert_step_matches(s, cl, chat=cl.path.endswith("chat/completions"))
    assert steps[0]["metadata"].get("tools") == TOOLS or steps[0].get("tools") == TOOLS
    traj = trajectory_of(gw, sid)
    assert traj["task_id"] == "task-a" and traj["num_steps"] == 5
    assert traj["reward"] == 1.0 and traj["is_correct"] is True
    assert traj["signals"] == {"accuracy": 1.0}
    assert traj["termination_reason"].lower() == "env_done"


def test_stream_passes_through_chunk_by_chunk(gateway, llm):
    gw = gateway()
    llm.chunk_delay = 0.05
    c = agent(gw, "task-s:0")
    t0 = time.monotonic()
    first = None
    for ch in c.chat.completions.create(model=MODEL, messages=QUESTION, stream=True, extra_headers=fx("vllm_chat_stream")):
        if first is None:
            first = time.monotonic() - t0
    total = time.monotonic() - t0
    n = len(llm.fixtures["vllm_chat_stream"].sse)
    assert total >= 0.05 * (n - 2)
    assert first < total / 3, f"first chunk after {first:.3f}s of {total:.3f}s: the stream was buffered"


def test_n2_records_choice_zero(gateway, llm):
    gw = gateway()
    sid = "task-n:0"
    r = agent(gw, sid).chat.completions.create(model=MODEL, messages=QUESTION, n=2, extra_headers=fx("vllm_chat_n2"))
    assert len(r.choices) == 2
    gw.finish(sid, reward=0.5)
    steps = steps_of(gw, sid)
    assert len(steps) == 1
    assert_step_matches(steps[0], llm.wait_completed(1)[0])
    assert steps[0]["metadata"].get("n") == 2


def test_multi_turn_sessions_in_parallel(gateway, llm):
    """Several agents at once, each several calls: every call exactly once, in
    its own session, in call order."""
    gw = gateway()
    turns, agents = 4, 6
    errors = []

    def run(i):
        try:
            c = agent(gw, f"task-p:{i}")
            msgs = list(QUESTION)
            for t in range(turns):
                name = "vllm_chat_stream" if (i + t) % 2 else "vllm_chat"
                if name.endswith("stream"):
                    text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
                        model=MODEL, messages=msgs, stream=True, extra_headers=fx(name)) if ch.choices)
                else:
                    text = c.chat.completions.create(model=MODEL, messages=msgs, extra_headers=fx(name)).choices[0].message.content
                msgs = msgs + [{"role": "assistant", "content": text}, {"role": "user", "content": f"turn {t}"}]
            gw.finish(f"task-p:{i}", reward=float(i))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(agents)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    calls = llm.wait_completed(turns * agents)
    for i in range(agents):
        sid = f"task-p:{i}"
        steps = steps_of(gw, sid)
        assert [s["step_index"] for s in steps] == list(range(turns))
        for t, s in enumerate(steps):
            # Each turn's request carries the whole conversation so far.
            assert len(s["messages"]) == len(QUESTION) + 2 * t + 1
            cl = next(c for c in calls if c.request["messages"] == s["messages"][:-1])
            assert_step_matches(s, cl)
        assert trajectory_of(gw, sid)["num_steps"] == turns
    steps = [r for r in gw.records() if r["type"] == "step"]
    assert len(steps) == turns * agents == len({s["step_id"] for s in steps})


def test_agent_gone_before_the_answer_is_recorded(gateway, llm):
    """An agent that gives up on a call before the backend answers (the
    openai SDK's timeout) still has the call recorded, whole, marked
    cut_off = client_disconnect, with the backend's own finish reason: the
    backend served it, so the data is not lost."""
    gw = gateway()
    sid = "task-gone:0"
    c = openai.OpenAI(base_url=gw.session_url(sid), api_key="unused", max_retries=0, timeout=0.3)
    with pytest.raises(openai.APITimeoutError):
        c.chat.completions.create(model=MODEL, messages=QUESTION, extra_headers={**fx("vllm_chat"), "X-Stub-Delay-Ms": "1000"})
    deadline = time.time() + 10
    while httpx.get(f"{gw.url}/sessions/{sid}", timeout=5).json().get("trace_count", 0) < 1:
        assert time.time() < deadline, "the call the agent left was not recorded"
        time.sleep(0.05)
    assert gw.finish(sid, reward=0.0)["num_steps"] == 1
    (s,) = steps_of(gw, sid)
    want = llm.fixtures["vllm_chat"].expect
    assert s["metadata"]["cut_off"] == "client_disconnect"
    assert s["finish_reason"] == want["finish_reason"]
    assert s["response_ids"] == want["response_ids"] and s["prompt_ids"] == want["prompt_ids"]
    assert s["response_logprobs"] == pytest.approx(want["response_logprobs"])


def test_client_disconnect_mid_stream_is_recorded_cut_off(gateway, llm):
    gw = gateway()
    sid = "task-d:0"
    llm.chunk_delay = 0.1
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", gw.session_url(sid) + "/chat/completions", headers=fx("vllm_chat_stream"),
                         json={"model": MODEL, "messages": QUESTION, "stream": True}) as r:
            assert r.status_code == 200
            got = 0
            for line in r.iter_lines():
                if line.startswith("data: "):
                    got += 1
                if got == 3:
                    break
    # The call is recorded once the gateway sees the agent gone; then finish.
    deadline = time.time() + 10
    while httpx.get(f"{gw.url}/sessions/{sid}", timeout=5).json().get("trace_count", 0) < 1:
        assert time.time() < deadline, "the cut-off call was not recorded"
        time.sleep(0.05)
    gw.finish(sid, reward=0.0)
    steps = steps_of(gw, sid)
    assert len(steps) == 1
    s = steps[0]
    assert s["finish_reason"] == "abort"
    assert s["metadata"]["cut_off"] == "client_disconnect"
    # What arrived before the agent left: a prefix of the answer.
    want = llm.fixtures["vllm_chat_stream"].expect
    assert s["prompt_ids"] == want["prompt_ids"]
    assert s["response_ids"] == want["response_ids"][: len(s["response_ids"])]
    assert len(s["response_ids"]) < len(want["response_ids"])
    assert trajectory_of(gw, sid)["num_steps"] == 1


def test_weight_version_change_mid_run(gateway, llm):
    """The version in force at dispatch: a stream in flight when the version
    changes keeps the old one; later calls get the new one."""
    gw = gateway("--policy-version", "3")
    gc = GatewayClient(gw.url)
    sid = "task-w:0"
    c = agent(gw, sid)
    assert get_weight_version(gc) == 3
    c.chat.completions.create(model=MODEL, messages=QUESTION, extra_headers=fx("vllm_chat"))

    llm.chunk_delay = 0.05
    stream = c.chat.completions.create(model=MODEL, messages=QUESTION, stream=True, extra_headers=fx("vllm_chat_stream"))
    it = iter(stream)
    next(it)  # dispatched and answering
    assert set_weight_version(gc, 4) == 4
    for _ in it:
        pass
    llm.chunk_delay = 0.0
    c.chat.completions.create(model=MODEL, messages=QUESTION, extra_headers=fx("vllm_chat"))
    assert get_weight_version(gc) == 4
    gw.finish(sid, reward=1.0)
    assert [s["policy_version"] for s in steps_of(gw, sid)] == [3, 3, 4]


def test_upstream_error_reaches_the_agent_and_records_nothing(gateway, llm):
    gw = gateway()
    sid = "task-e:0"
    c = agent(gw, sid)
    llm.fail_next(500)
    with pytest.raises(openai.InternalServerError):
        c.chat.completions.create(model=MODEL, messages=QUESTION, extra_headers=fx("vllm_chat"))
    c.chat.completions.create(model=MODEL, messages=QUESTION, extra_headers=fx("vllm_chat"))
    gw.finish(sid, reward=1.0)
    steps = steps_of(gw, sid)
    assert [s["step_index"] for s in steps] == [0]
    assert trajectory_of(gw, sid)["num_steps"] == 1


def test_gateway_client_admin_api(gateway, llm):
    """rLLM's GatewayClient, unchanged, on our management API."""
    gw = gateway()
    with GatewayClient(gw.url) as gc:
        assert gc.health()["status"] == "ok"
        sid = gc.create_session(session_id="task-g:0", metadata={"task": "g"})
        assert sid == "task-g:0"
        assert gc.get_session_url(sid) == gw.session_url(sid)
        anon = gc.create_session()
        assert anon and anon != sid
        c = agent(gw, sid)
        c.chat.completions.create(model=MODEL, messages=QUESTION, extra_headers=fx("vllm_chat"))
        list(c.chat.completions.create(model=MODEL, messages=QUESTION, stream=True, extra_headers=fx("vllm_chat_stream")))
        assert gc.flush() is True

        ids = {s["session_id"] for s in gc.list_sessions()}
        assert {sid, anon} <= ids
        info = gc.get_session_info(sid)
        assert info["session_id"] == sid and info["trace_count"] == 2

        traces = gc.get_session_traces(sid)
        assert all(isinstance(t, TraceRecord) for t in traces) and len(traces) == 2
        calls = llm.wait_completed(2)
        for t, cl in zip(sorted(traces, key=lambda t: t.timestamp), calls):
            exp = stub_llm.expected(cl)
            assert t.session_id == sid
            assert t.prompt_token_ids == exp["prompt_ids"]
            assert t.completion_token_ids == exp["response_ids"]
            assert t.logprobs == pytest.approx(exp["logprobs"])
            assert t.finish_reason == exp["finish_reason"]
            assert t.messages == QUESTION
            assert t.response_message.get("content") == exp["message"]["content"]
        assert len(gc.get_session_traces(sid, limit=1)) == 1

        workers = gc.list_workers()
        assert [w.url for w in workers] == [llm.url] and workers[0].healthy
        with stub_llm.StubLLM(llm.fixtures) as other:
            wid = gc.add_worker(other.url)
            assert {w.url for w in gc.list_workers()} == {llm.url, other.url}
            gc.remove_worker(wid)
        assert [w.url for w in gc.list_workers()] == [llm.url]

        assert set_weight_version(gc, 9) == 9 and get_weight_version(gc) == 9
        assert gc.delete_session(anon) >= 0
        assert anon not in {s["session_id"] for s in gc.list_sessions()}
        with pytest.raises(httpx.HTTPStatusError):
            gc.get_session_info("no-such-session")


def test_gateway_client_get_trace(gateway, llm):
    gw = gateway()
    with GatewayClient(gw.url) as gc:
        sid = gc.create_session(session_id="task-tr:0")
        agent(gw, sid).chat.completions.create(model=MODEL, messages=QUESTION, extra_headers=fx("vllm_chat"))
        (t,) = gc.get_session_traces(sid)
        got = gc.get_trace(t.trace_id)
        assert got.trace_id == t.trace_id and got.completion_token_ids == t.completion_token_ids


def test_session_ids_with_slashes_and_colons(gateway, llm):
    gw = gateway()
    sid = "org/task:7/run:2"
    agent(gw, sid).chat.completions.create(model=MODEL, messages=QUESTION, extra_headers=fx("vllm_chat"))
    gw.finish(sid, reward=1.0)
    steps = steps_of(gw, sid)
    assert len(steps) == 1 and sid_of(steps[0]) == sid


def test_sglang_shapes(gateway, llm, tmp_path):
    """SGLang's native /generate is recorded from its own layout; SGLang's
    chat endpoint returns no token ids, so its step is marked and ingest
    dead-letters it missing_field (never a step without tokens)."""
    gw = gateway("--group-size", "1")
    gen = llm.fixtures["sglang_generate"]
    r = httpx.post(f"{gw.url}/sessions/sg-gen:0/generate", json=gen.request, headers=fx("sglang_generate"), timeout=30)
    assert r.status_code == 200 and r.json()["output_ids"] == gen.expect["response_ids"]
    gs = llm.fixtures["sglang_generate_stream"]
    with httpx.stream("POST", f"{gw.url}/sessions/sg-gen:0/generate", json=gs.request, headers=fx("sglang_generate_stream"), timeout=30) as r:
        assert r.status_code == 200
        events = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    agent(gw, "sg-chat:0").chat.completions.create(model=MODEL, messages=QUESTION, extra_headers=fx("sglang_chat"))
    gw.finish("sg-gen:0", reward=1.0)
    gw.finish("sg-chat:0", reward=1.0)

    steps = steps_of(gw, "sg-gen:0")
    assert len(steps) == 2
    for s, f in zip(steps, (gen, gs)):
        assert s["prompt_ids"] == f.expect["prompt_ids"]
        assert s["response_ids"] == f.expect["response_ids"]
        assert s["response_logprobs"] == pytest.approx(f.expect["response_logprobs"])
        assert s["finish_reason"] == f.expect["finish_reason"]
    (chat,) = steps_of(gw, "sg-chat:0")
    assert chat["metadata"]["gateway_reject"] == "missing_token_ids"

    out = tmp_path / "shards"
    subprocess.run([BIN, "ingest", "--from", str(gw.log), "--to", str(out), "--group-size", "1", "--quiet"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    reasons = {}
    for p in (out / "_dlq").glob("*.jsonl"):
        for line in p.read_text().splitlines():
            d = json.loads(line)
            rec = d.get("record")
            rec = json.loads(rec) if isinstance(rec, str) else rec
            if isinstance(rec, dict) and rec.get("type") == "step":
                reasons[rec["step_id"]] = d["reason"]
    assert reasons == {chat["step_id"]: llm.fixtures["sglang_chat"].expect["dead_letter"]}


def test_shard_root_output_call_by_call(gateway, llm, tmp_path):
    """The embedded default (`--to ROOT`, the pipeline in-process): agents in
    groups of two, a weight-version change between the two rounds; once the
    gateway stops, the committed shards hold every call once, equal to the
    stub's answer, with its version at dispatch and its group's advantage."""
    root = tmp_path / "data"
    gw = gateway("--group-size", "2", "--flush-interval", "200ms", to=root)
    gc = GatewayClient(gw.url)
    names = ["vllm_chat", "vllm_chat_stream", "vllm_chat_tools", "vllm_completions_stream"]
    made = {}  # (session, index) -> (fixture, version)
    for rnd, version in ((0, 0), (1, 5)):
        if version:
            set_weight_version(gc, version)
        for task in range(3):
            for r in range(2):
                sid = f"root-{task}:{r}"
                name = names[(task + r + rnd) % len(names)]
                c = agent(gw, sid)
                f = llm.fixtures[name]
                if f.path == "/v1/completions":
                    list(c.completions.create(model=MODEL, prompt="The capital of France is", stream=True, extra_headers=fx(name)))
                else:
                    out = c.chat.completions.create(model=MODEL, messages=QUESTION, stream=f.streaming, extra_headers=fx(name))
                    if f.streaming:
                        list(out)
                made[(sid, rnd)] = (name, version)
    rewards = {}
    for task in range(3):
        for r in range(2):
            rewards[f"root-{task}:{r}"] = float(r)
            gw.finish(f"root-{task}:{r}", reward=float(r), is_correct=bool(r))
    assert gw.stop() == 0

    with open(root / "_manifest" / "shards.jsonl") as f:
        paths = [json.loads(line)["path"] for line in f if json.loads(line).get("path")]
    cols = ["step_id", "trajectory_id", "task_id", "step_index", "policy_version", "prompt_ids", "prompt_prefix_len",
            "response_ids", "response_logprobs", "finish_reason", "reward", "advantage"]
    rows = []
    for p in paths:
        t = pq.read_table(root / p)
        rows.extend(t.select([c for c in cols if c in t.column_names]).to_pylist())
    assert sorted((sid_of(r), r["step_index"]) for r in rows) == sorted(made)
    assert len({r["step_id"] for r in rows}) == len(rows)
    for r in rows:
        name, version = made[(sid_of(r), r["step_index"])]
        want = llm.fixtures[name].expect
        assert r["task_id"] == r["trajectory_id"].split(":")[0]
        assert r["policy_version"] == version
        if not r.get("prompt_prefix_len"):
            assert r["prompt_ids"] == want["prompt_ids"]
        assert r["response_ids"] == want["response_ids"]
        assert r["response_logprobs"] == pytest.approx(want["response_logprobs"], abs=1e-6)
        assert r["finish_reason"] == want["finish_reason"]
        assert r["reward"] == rewards[sid_of(r)]
        # GRPO over a group of two with rewards 0 and 1: -1 and +1.
        assert r["advantage"] == pytest.approx(1.0 if r["reward"] else -1.0, abs=1e-3)


def test_bearer_tokens_with_real_clients(gateway, llm, tmp_path, monkeypatch):
    """The openai SDK's api_key is the agent token; a wrong one is refused
    (401) and records nothing; management needs the admin token, which
    agent routes take too (as rLLM's gateway does), as does x-api-key; the
    workers get the upstream key, never the gateway's tokens."""
    (tmp_path / "agent").write_text("agent-secret-1\n")
    (tmp_path / "admin").write_text("admin-secret-2\n")
    monkeypatch.setenv("TEST_VLLM_KEY", "upstream-secret-3")
    gw = gateway("--agent-token-file", str(tmp_path / "agent"), "--admin-token-file", str(tmp_path / "admin"),
                 "--upstream-key-env", "TEST_VLLM_KEY")
    sid = "task-tok:0"
    bad = openai.OpenAI(base_url=gw.session_url(sid), api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=MODEL, messages=QUESTION, extra_headers=fx("vllm_chat"))
    assert llm.calls == []
    ok = openai.OpenAI(base_url=gw.session_url(sid), api_key="agent-secret-1", max_retries=0)
    assert ok.chat.completions.create(model=MODEL, messages=QUESTION, extra_headers=fx("vllm_chat")).choices[0].message.content
    # The admin token works on agent routes; so does x-api-key.
    as_admin = openai.OpenAI(base_url=gw.session_url(sid), api_key="admin-secret-2", max_retries=0)
    assert as_admin.chat.completions.create(model=MODEL, messages=QUESTION, extra_headers=fx("vllm_chat")).choices[0].message.content
    r = httpx.post(gw.session_url(sid) + "/chat/completions", json={"model": MODEL, "messages": QUESTION},
                   headers={"x-api-key": "agent-secret-1", **fx("vllm_chat")}, timeout=30)
    assert r.status_code == 200, r.text
    assert len(llm.calls) == 3
    for c in llm.calls:
        got = {k.lower(): v for k, v in c.headers.items()}
        assert got.get("authorization") == "Bearer upstream-secret-3" and "x-api-key" not in got
    # The agent token is not an admin token.
    assert httpx.get(f"{gw.url}/sessions/{sid}", headers={"Authorization": "Bearer agent-secret-1"}).status_code == 401
    assert httpx.get(f"{gw.url}/sessions/{sid}", headers={"x-api-key": "agent-secret-1"}).status_code == 401
    admin = {"Authorization": "Bearer admin-secret-2"}
    assert httpx.get(f"{gw.url}/sessions/{sid}", headers={"x-api-key": "admin-secret-2"}).json()["trace_count"] == 3
    r = httpx.post(f"{gw.url}/sessions/{sid}/finish", json={"reward": 1.0}, headers=admin, timeout=60)
    assert r.status_code == 200, r.text
    assert gw.stop() == 0
    steps = [x for x in gw.records() if x["type"] == "step"]
    assert len(steps) == 3 and all(sid_of(s) == sid for s in steps)
    err = gw.proc.stderr.read().decode()
    assert "agent-secret-1" not in err and "admin-secret-2" not in err and "upstream-secret-3" not in err
