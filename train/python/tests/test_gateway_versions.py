"""Off-policy data through the real gateway: a generative stub engine whose
weights move in the middle of generations and an agent whose chat template
re-renders history. The openai SDK drives `rllm-pipe gateway --to ROOT`;
`rllm-pipe sql` reads back every token's policy version, every interrupt,
every prompt fork and the sampling parameters, compared with what the stub
sent and a walk of the token ids written here."""

import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai
import pytest

from conftest import BIN, Gateway, has_gateway_command

ROLE = {"system": 1, "user": 2, "assistant": 3, "tool": 4}
END = 9


def encode(text):
    """The stub's tokenizer: one token per character."""
    return [100 + ord(c) for c in text]


def render(messages):
    """The stub's chat template: each message as its role, its content and
    END, then the assistant's turn."""
    out = []
    for m in messages:
        out += [ROLE[m["role"]]] + encode(m.get("content") or "") + [END]
    return out + [ROLE["assistant"]]


class Engine:
    """A vLLM-like engine on loopback. Each call generates a deterministic
    answer, ``<think>…</think>`` then the answer text. A call's plan comes
    in the header X-Plan: "stamped" (every streamed chunk carries the
    engine's weight_version; a non-streamed answer output_versions per
    token), "unstamped" (no versions: the gateway's own count), and
    interrupt=K: the weights move before token K (stamped: the engine's
    version goes up by one; unstamped: ``on_interrupt`` moves the
    gateway's)."""

    def __init__(self):
        self.version = 0
        self.on_interrupt = None
        self.calls = []  # dicts: request, prompt, response, versions (None when unstamped), stream
        self._lock = threading.Lock()
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status, obj):
                body = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._send(200, {"status": "ok"} if self.path == "/health" else {"object": "list", "data": []})

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                plan = dict(kv.split("=") if "=" in kv else (kv, "1") for kv in (self.headers.get("X-Plan") or "").split(";") if kv)
                engine.answer(self, req, plan)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        host, port = self._server.server_address[:2]
        self.url = f"http://{host}:{port}"

    def stop(self):
        self._server.shutdown()
        self._server.server_close()

    def answer(self, h, req, plan):
        messages = req["messages"]
        turn = sum(m["role"] == "user" for m in messages)
        text = f"<think>step {turn}: {len(messages)} messages</think>answer {turn}"
        prompt, response = render(messages), encode(text) + [END]
        logprobs = [-0.01 * (i + 1) for i in range(len(response))]
        stamped = "stamped" in plan
        interrupt = int(plan.get("interrupt", -1))
        versions = [] if stamped else None
        call = {"request": req, "prompt": prompt, "response": response, "versions": versions, "stream": bool(req.get("stream"))}
        with self._lock:
            self.calls.append(call)
        lp = lambda i: {"token": chr(response[i] - 100) if response[i] >= 100 else "", "logprob": logprobs[i], "bytes": [], "top_logprobs": []}
        extra = {"logprobs_mode": plan["mode"]} if "mode" in plan else {}
        if not req.get("stream"):
            for i in range(len(response)):
                if i == interrupt and stamped:
                    self.version += 1
                if stamped:
                    versions.append(self.version)
            if interrupt >= 0 and not stamped:
                raise AssertionError("a non-streamed call cannot be interrupted without output_versions")
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop",
                      "token_ids": response, "logprobs": {"content": [lp(i) for i in range(len(response))]}}
            if stamped:
                choice["output_versions"] = versions
            return h._send(200, {"id": "c", "object": "chat.completion", "created": 0, "model": req["model"],
                                 "prompt_token_ids": prompt, "choices": [choice], **extra,
                                 "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(response), "total_tokens": len(prompt) + len(response)}})
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()

        def write(obj):
            event = f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()
            h.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            h.wfile.flush()

        for i, tok in enumerate(response):
            if i == interrupt:
                if stamped:
                    self.version += 1
                else:
                    # The chunks so far are out; once the gateway has read
                    # them (it has no reason to take 200 ms) its version moves.
                    time.sleep(0.2)
                    self.on_interrupt()
            chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": req["model"],
                     "choices": [{"index": 0, "delta": {"content": text[i] if i < len(text) else ""}, "token_ids": [tok],
                                  "logprobs": {"content": [lp(i)]}, "finish_reason": "stop" if i == len(response) - 1 else None}]}
            if i == 0:
                chunk["prompt_token_ids"] = prompt
                chunk.update(extra)
            if stamped:
                chunk["weight_version"] = self.version
                versions.append(self.version)
            write(chunk)
        write("[DONE]")
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()


def strip_thinking(m):
    if m["role"] != "assistant" or "</think>" not in (m.get("content") or ""):
        return m
    return {**m, "content": m["content"].split("</think>", 1)[1]}


def first_divergence(prompt, prev):
    at = 0
    while at < len(prompt) and at < len(prev) and prompt[at] == prev[at]:
        at += 1
    return at


def sql(root, query):
    out = subprocess.run([BIN, "sql", "--from", str(root), "--format", "jsonl", query], check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.fixture
def engine():
    e = Engine()
    yield e
    e.stop()


def test_versions_interrupts_forks_and_sampling_come_back_exactly(engine, tmp_path):
    if not has_gateway_command():
        pytest.skip("this rllm-pipe has no `gateway` command")
    root = tmp_path / "data"
    gw = Gateway(tmp_path, engine.url, "--group-size", "2", "--flush-interval", "200ms", to=root)
    admin = httpx.Client(base_url=gw.url, timeout=30)

    def gateway_version(v):
        admin.post("/admin/weight_version", json={"weight_version": v}).raise_for_status()

    gw_version = 0
    gateway_version(gw_version)

    def bump_gateway():
        nonlocal gw_version
        gw_version += 1
        gateway_version(gw_version)

    engine.on_interrupt = bump_gateway
    # Sessions: (plan per turn, how the agent renders history). Plans cover
    # streamed and not, stamped and not, interrupted and not; rendering
    # keeps history, strips earlier thinking (a template that re-renders:
    # forks inside the previous answer), or resets the context at turn 3.
    sessions = {
        "t0:0": (["stamped", "stamped;interrupt=5", "stamped;interrupt=0"], "keep", True),
        "t0:1": (["unstamped;interrupt=7", "unstamped", "stamped;interrupt=12"], "strip", True),
        "t1:0": (["stamped;mode=raw_logprobs", "stamped;interrupt=3", "stamped"], "strip", False),
        "t1:1": (["unstamped", "stamped;interrupt=9", "unstamped"], "reset", True),
        "t2:0": (["unstamped;interrupt=2", "stamped;mode=processed_logprobs", "stamped;interrupt=20"], "keep", True),
        "t2:1": (["stamped", "unstamped", "stamped"], "strip", False),
    }
    made = {}  # (session, step) -> expected token versions, and the call
    sampling = {"temperature": 1.0, "top_p": 0.95, "top_k": 40, "seed": 7, "max_tokens": 64}
    for sid, (plans, rendering, stream) in sessions.items():
        agent = openai.OpenAI(base_url=gw.session_url(sid), api_key="unused", max_retries=0, timeout=30)
        history = [{"role": "system", "content": "Be brief."}]
        for step, plan in enumerate(plans):
            history.append({"role": "user", "content": f"question {step} of {sid}"})
            sent = history
            if rendering == "strip":
                sent = [strip_thinking(m) for m in history]
            elif rendering == "reset" and step == 2:
                sent = [history[0], {"role": "user", "content": "summary so far; " + history[-1]["content"]}]
            at_dispatch = gw_version
            kw = dict(model="stub", messages=sent, extra_headers={"X-Plan": plan},
                      temperature=sampling["temperature"], top_p=sampling["top_p"], seed=sampling["seed"],
                      max_tokens=sampling["max_tokens"], extra_body={"top_k": sampling["top_k"]})
            if stream:
                text = "".join(ch.choices[0].delta.content or "" for ch in agent.chat.completions.create(stream=True, **kw) if ch.choices)
            elif "interrupt" in plan and "unstamped" in plan:
                pytest.fail("plan error: a non-streamed call is interrupted only with output_versions")
            else:
                text = agent.chat.completions.create(**kw).choices[0].message.content
            call = engine.calls[-1]
            assert text == "".join(chr(t - 100) for t in call["response"][:-1])
            if call["versions"] is not None:
                want = list(call["versions"])
            else:
                k = int(dict(kv.split("=") for kv in plan.split(";") if "=" in kv).get("interrupt", len(call["response"])))
                want = [at_dispatch] * k + [gw_version] * (len(call["response"]) - k)
            made[(sid, step)] = (want, call)
            history.append({"role": "assistant", "content": text})
    for sid in sessions:
        gw.finish(sid, reward=float(sid.endswith(":1")))
    assert gw.stop() == 0

    # The independent walk: where each step's prompt leaves the previous
    # step's prompt + response, from the token ids the engine saw and sent.
    forks = {}
    for sid, (plans, _, _) in sessions.items():
        for step in range(1, len(plans)):
            prev = made[(sid, step - 1)][1]
            cur = made[(sid, step)][1]
            whole = prev["prompt"] + prev["response"]
            at = first_divergence(cur["prompt"], whole)
            if at < len(whole):
                forks[(sid, step)] = (at, len(whole))
    assert any(at < len(made[k][1]["prompt"]) for k, (at, _) in forks.items()), "the workload must fork"
    assert sum(len(set(v)) > 1 for v, _ in made.values()) >= 7, "the workload must interrupt"

    sid_of = lambda tid: tid.rsplit("@", 1)[0]
    rows = sql(root, "SELECT v.trajectory_id, v.step_index, v.policy_version, v.oldest_version, v.newest_version, v.response_versions, "
                     "v.version_changes, v.finish_reason, s.prompt_ids, s.response_ids, s.group_version, "
                     "json_extract(s.metadata, '$.prompt_fork.at')::BIGINT AS fork_at_recorded "
                     "FROM step_versions v JOIN steps s USING (step_id) ORDER BY 1, 2")
    assert sorted((sid_of(r["trajectory_id"]), r["step_index"]) for r in rows) == sorted(made)
    group_oldest = {}
    for r in rows:
        key = (sid_of(r["trajectory_id"]), r["step_index"])
        want, call = made[key]
        assert r["prompt_ids"] == call["prompt"] and r["response_ids"] == call["response"], key
        assert r["response_versions"] == want, key
        assert r["policy_version"] == want[0], key  # the step at its first token's version
        assert (r["oldest_version"], r["newest_version"]) == (min(want), max(want)), key
        changes = [{"at": i, "version": want[i]} for i in range(1, len(want)) if want[i] != want[i - 1]]
        assert r["version_changes"] == changes, key
        assert r["finish_reason"] == "stop", key
        assert r["fork_at_recorded"] == (forks[key][0] if key in forks else None), key
        task = key[0].split(":")[0]
        group_oldest[task] = min(group_oldest.get(task, min(want)), min(want))
    # A group is judged by its oldest token.
    for r in rows:
        assert r["group_version"] == group_oldest[sid_of(r["trajectory_id"]).split(":")[0]]

    got = {(sid_of(r["trajectory_id"]), r["step_index"]): (r["fork_at"], r["prev_tokens"])
           for r in sql(root, "SELECT trajectory_id, step_index, fork_at, prev_tokens FROM prompt_forks")}
    assert got == forks

    # Sampling as sent, the engine's logprobs mode where it stamped one.
    for r in sql(root, "SELECT trajectory_id, step_index, temperature, top_p, top_k, seed, max_tokens, logprobs_mode FROM step_sampling"):
        key = (sid_of(r["trajectory_id"]), r["step_index"])
        plan = sessions[key[0]][0][key[1]]
        mode = dict(kv.split("=") for kv in plan.split(";") if "=" in kv).get("mode")
        assert (r["temperature"], r["top_p"], r["top_k"], r["seed"], r["max_tokens"], r["logprobs_mode"]) == (
            sampling["temperature"], sampling["top_p"], sampling["top_k"], sampling["seed"], sampling["max_tokens"], mode), key
