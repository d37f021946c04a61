"""The stub backend itself: every committed fixture loads and replays, and
the stub answers as vLLM does (token ids and logprobs only when asked for),
so that the gateway tests built on it can fail."""

import json

import httpx
import pytest

import stub_llm


def test_fixtures_load(llm):
    if not llm.fixtures:
        pytest.skip("no fixtures under ingest/gateway/testdata yet")
    kinds = {stub_llm._kind(fx) for fx in llm.fixtures.values()}
    assert "chat" in kinds
    assert any(fx.streaming for fx in llm.fixtures.values())


def test_every_fixture_replays(llm):
    if not llm.fixtures:
        pytest.skip("no fixtures under ingest/gateway/testdata yet")
    http = httpx.Client(timeout=10)
    for i, (name, fx) in enumerate(sorted(llm.fixtures.items())):
        req = {**fx.request, "stream": fx.streaming}
        r = http.post(llm.url + fx.path, json=req, headers={"X-Fixture": name})
        assert r.status_code == fx.status, name
        call = llm.wait_completed(i + 1)[-1]
        assert call.fixture == name and call.completed
        if fx.streaming:
            events = [ln[6:] for ln in r.text.split("\n\n") if ln.startswith("data: ")]
            assert events[-1] == "[DONE]", name
            assert [json.loads(e) for e in events[:-1]] == [c for c in call.sent if isinstance(c, dict)]
        else:
            assert r.json() == call.sent
        if fx.path == "/generate":
            continue
        exp = stub_llm.expected(call)
        want = fx.expect
        if "prompt_ids" in want:
            assert exp["prompt_ids"] == want["prompt_ids"], name
        if "response_ids" in want:
            assert exp["response_ids"] == want["response_ids"], name
        if "response_logprobs" in want:
            assert exp["logprobs"] == want["response_logprobs"], name
        for pos in want.get("null_logprob_positions", []):
            assert exp["logprobs"][pos] is None, name
        if "finish_reason" in want:
            assert exp["finish_reason"] == want["finish_reason"], name
        for k, v in want.get("response_message", {}).items():
            assert exp["message"].get(k) == v, (name, k)


def test_vllm_rules(llm):
    """No token ids unless return_token_ids, no logprobs unless logprobs."""
    fx = stub_llm.Fixture(
        "t",
        {},
        response={
            "object": "chat.completion",
            "model": "m",
            "prompt_token_ids": [1, 2],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}, "token_ids": [5],
                         "logprobs": {"content": [{"token": "x", "logprob": -1.0}]}, "finish_reason": "stop"}],
        },
    )
    with stub_llm.StubLLM({"t": fx}) as s:
        bare = httpx.post(s.url + "/v1/chat/completions", json={"model": "t", "messages": []}).json()
        assert "prompt_token_ids" not in bare and "token_ids" not in bare["choices"][0]
        assert bare["choices"][0]["logprobs"] is None
        full = httpx.post(s.url + "/v1/chat/completions",
                          json={"model": "t", "messages": [], "logprobs": True, "extra_body": {"return_token_ids": True}}).json()
        assert full == fx.response
        exp = stub_llm.expected(s.calls[-1])
        assert exp["prompt_ids"] == [1, 2] and exp["response_ids"] == [5] and exp["logprobs"] == [-1.0]
        s.fail_next(503)
        assert httpx.post(s.url + "/v1/chat/completions", json={"model": "t"}).status_code == 503
        assert httpx.post(s.url + "/v1/chat/completions", json={"model": "t"}).status_code == 200


def test_sse_transcript_forms():
    lines = ['data: {"a": 1}', "", ": comment", "data: [DONE]"]
    assert stub_llm._sse_payloads(lines) == [{"a": 1}, "[DONE]"]
    assert stub_llm._sse_payloads('data: {"a": 1}\n\ndata: [DONE]\n\n') == [{"a": 1}, "[DONE]"]
    assert stub_llm._sse_payloads([{"a": 1}, "[DONE]"]) == [{"a": 1}, "[DONE]"]
