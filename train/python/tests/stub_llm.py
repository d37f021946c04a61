"""A stub LLM backend for the gateway tests: it replays the exact vLLM and
SGLang response shapes committed in ingest/gateway/testdata/ (the same
fixtures the Go stub, ingest/gateway/gatewaytest, replays), over a real
HTTP server on loopback (the standard library's http.server, one thread a
connection).

A fixture is a JSON file (ingest/gateway/testdata/*.json): {"name", "engine",
"path", "request", "response"} for a plain answer, or "sse_data" (the SSE
data payloads in order, "[DONE]" included) instead of "response" for a
streamed one, and "expect" (what a gateway should record). The call picks
its fixture by the header X-Fixture (as the Go stub does), else by the request's "model" when
that names a fixture, else the engine's plain or streaming default for the
path (vllm_chat, vllm_completions, sglang_generate, + "_stream").

The stub behaves as vLLM does where the gateways' rewriting matters: token
ids are only returned when the request has return_token_ids (at the root or
in extra_body), logprobs only when the request asks for them, so a gateway
that forgot to force them records nothing. Every call is kept (request,
fixture, what was sent, whether the stream reached its end) for the tests
to compare what each gateway recorded against what the backend returned.

Knobs: chunk_delay (seconds between SSE events), the header
X-Stub-Delay-Ms: N (wait before answering, as a busy engine does),
fail_next(status) or the header X-Stub-Fail: STATUS (answer with that
status), and the /health and /v1/models routes a gateway probes.
"""

from __future__ import annotations

import copy
import json
import pathlib
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[3]
FIXTURES = REPO / "ingest" / "gateway" / "testdata"

MAX_BODY = 8 << 20


@dataclass
class Fixture:
    name: str
    request: dict
    response: dict | None = None  # plain JSON answer
    sse: list | None = None  # SSE data payloads (dicts, or "[DONE]")
    status: int = 200
    path: str = "/v1/chat/completions"
    expect: dict = field(default_factory=dict)

    @property
    def streaming(self) -> bool:
        return self.sse is not None

    def chunks(self) -> list[dict]:
        return [c for c in (self.sse or []) if isinstance(c, dict)]


def _sse_payloads(raw) -> list:
    """The data payloads of an SSE transcript: a list of chunk objects, of
    "data: ..." lines, or one string holding the whole transcript."""
    if isinstance(raw, str):
        raw = raw.splitlines()
    out = []
    for item in raw:
        if isinstance(item, dict):
            out.append(item)
            continue
        line = item.strip()
        if not line or line.startswith(":"):
            continue
        if line.startswith("data:"):
            line = line[5:].strip()
        out.append("[DONE]" if line == "[DONE]" else json.loads(line))
    return out


def parse_fixture(name: str, doc: Any) -> Fixture | None:
    """A Fixture from one file's JSON, or None when the file is not one."""
    if not isinstance(doc, dict):
        return None
    request = doc.get("request") or {}
    common = dict(
        name=str(doc.get("name") or name),
        request=request,
        status=int(doc.get("status", 200)),
        path=str(doc.get("path") or ("/v1/chat/completions" if "messages" in request else "/v1/completions")),
        expect=doc.get("expect") or {},
    )
    for key in ("sse_data", "sse"):
        if doc.get(key) is not None:
            return Fixture(sse=_sse_payloads(doc[key]), **common)
    if isinstance(doc.get("response"), dict):
        return Fixture(response=doc["response"], **common)
    return None


def load_fixtures(folder: pathlib.Path = FIXTURES) -> dict[str, Fixture]:
    """Every fixture under folder (recursively), by file name without .json;
    a name used twice is an error (the tests pick fixtures by name)."""
    out: dict[str, Fixture] = {}
    for p in sorted(pathlib.Path(folder).rglob("*.json")):
        try:
            doc = json.loads(p.read_text())
        except json.JSONDecodeError:
            continue
        fx = parse_fixture(p.stem, doc)
        if fx is None:
            continue
        if fx.name in out:
            raise ValueError(f"fixture name {fx.name} used twice under {folder}")
        out[fx.name] = fx
    return out


def wants_token_ids(req: dict) -> bool:
    extra = req.get("extra_body") if isinstance(req.get("extra_body"), dict) else {}
    return bool(req.get("return_token_ids") or extra.get("return_token_ids"))


def wants_logprobs(req: dict) -> bool:
    lp = req.get("logprobs")
    return lp is not None and lp is not False


def shape(payload: dict, req: dict) -> dict:
    """What vLLM would send for this request: no token ids unless asked for,
    no logprobs unless asked for (SGLang's native /generate answers as is)."""
    out = copy.deepcopy(payload)
    if "meta_info" in out:
        return out
    if not wants_token_ids(req):
        out.pop("prompt_token_ids", None)
        for c in out.get("choices") or []:
            c.pop("token_ids", None)
            c.pop("prompt_token_ids", None)
    if not wants_logprobs(req):
        for c in out.get("choices") or []:
            if "logprobs" in c:
                c["logprobs"] = None
    return out


@dataclass
class Call:
    """One request the stub answered."""

    path: str
    request: dict
    fixture: str | None
    status: int
    sent: Any = None  # the JSON answer, or the list of SSE payloads written
    completed: bool = False  # the whole answer reached the socket
    headers: dict = field(default_factory=dict)


class StubLLM:
    """The stub backend; start() binds 127.0.0.1 on a free port."""

    def __init__(self, fixtures: dict[str, Fixture] | None = None, host: str = "127.0.0.1"):
        self.fixtures = load_fixtures() if fixtures is None else fixtures
        self.host = host
        self.chunk_delay = 0.0
        self.calls: list[Call] = []
        self._fail: list[int] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------

    def start(self) -> "StubLLM":
        stub = self

        class Handler(_Handler):
            pass

        Handler.stub = stub
        self._server = ThreadingHTTPServer((self.host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="stub-llm", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "stub not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # -- control ----------------------------------------------------------

    def fail_next(self, status: int = 500, times: int = 1) -> None:
        with self._lock:
            self._fail.extend([status] * times)

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()
            self._fail.clear()
        self.chunk_delay = 0.0

    def calls_to(self, fixture: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.fixture == fixture]

    def wait_completed(self, n: int, timeout: float = 10.0) -> list[Call]:
        """The calls once n of them have finished writing (streams end after
        the client may have stopped reading)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                done = [c for c in self.calls if c.completed or c.status != 200]
                if len(done) >= n:
                    return list(self.calls)
            if time.monotonic() > deadline:
                raise TimeoutError(f"stub: {len(done)} of {n} calls finished")
            time.sleep(0.02)

    # -- routing ----------------------------------------------------------

    def pick(self, path: str, req: dict, header: str | None) -> Fixture | None:
        if header:
            return self.fixtures.get(header)
        model = req.get("model")
        if isinstance(model, str) and model in self.fixtures:
            return self.fixtures[model]
        base = DEFAULTS.get(path)
        if base is None:
            return None
        return self.fixtures.get(base + ("_stream" if req.get("stream") else ""))

    def _record(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)

    def _take_failure(self) -> int | None:
        with self._lock:
            return self._fail.pop(0) if self._fail else None


DEFAULTS = {"/v1/chat/completions": "vllm_chat", "/v1/completions": "vllm_completions", "/generate": "sglang_generate"}


def _kind(fx: Fixture) -> str:
    return {"/v1/chat/completions": "chat", "/v1/completions": "completions"}.get(fx.path, "generate")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    stub: StubLLM

    def log_message(self, *args):  # quiet
        pass

    def _json(self, status: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path == "/health":
            return self._json(200, {"status": "ok"})
        if path == "/v1/models":
            names = sorted(self.stub.fixtures)
            return self._json(200, {"object": "list", "data": [{"id": n, "object": "model", "owned_by": "stub"} for n in names]})
        return self._json(404, {"error": {"message": f"no route {path}", "type": "not_found"}})

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            return self._json(413, {"error": {"message": "body too large"}})
        raw = self.rfile.read(n) if n else b""
        try:
            req = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            return self._json(400, {"error": {"message": "body is not JSON", "type": "BadRequestError"}})
        if path not in DEFAULTS:
            return self._json(404, {"error": {"message": f"no route {path}", "type": "not_found"}})
        hdrs = {k.lower(): v for k, v in self.headers.items()}
        if (self.headers.get("X-Stub-Delay-Ms") or "").isdigit():
            time.sleep(int(self.headers["X-Stub-Delay-Ms"]) / 1000)
        fail = self.stub._take_failure()
        if (self.headers.get("X-Stub-Fail") or "").isdigit():
            fail = int(self.headers["X-Stub-Fail"])
        if fail is not None:
            body = {"error": {"message": "stub: injected failure", "type": "InternalServerError", "code": fail}}
            self.stub._record(Call(path, req, None, fail, body, True, hdrs))
            return self._json(fail, body)
        fx = self.stub.pick(path, req, self.headers.get("X-Fixture"))
        if fx is None:
            body = {"error": {"message": "stub: no fixture for this request", "type": "NotFoundError"}}
            self.stub._record(Call(path, req, None, 404, body, True, hdrs))
            return self._json(404, body)
        if not fx.streaming:
            sent = shape(fx.response, req)
            call = Call(path, req, fx.name, fx.status, sent, False, hdrs)
            self.stub._record(call)
            self._json(fx.status, sent)
            call.completed = True
            return
        self._stream(path, req, fx, hdrs)

    def _stream(self, path: str, req: dict, fx: Fixture, hdrs: dict) -> None:
        call = Call(path, req, fx.name, fx.status, [], False, hdrs)
        self.stub._record(call)
        self.send_response(fx.status)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for i, payload in enumerate(fx.sse):
                if i and self.stub.chunk_delay:
                    time.sleep(self.stub.chunk_delay)
                data = payload if payload == "[DONE]" else shape(payload, req)
                event = f"data: {data if data == '[DONE]' else json.dumps(data)}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
                call.sent.append(data)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            call.completed = True
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


def expected(call: Call) -> dict:
    """What a faithful gateway should record from one call the stub answered:
    choice 0's prompt ids, response ids, logprobs (None entries kept), the
    assistant message, finish reason and model, from the answer as sent."""
    if isinstance(call.sent, list):
        return _expected_stream([c for c in call.sent if isinstance(c, dict)], call.request)
    return _expected_plain(call.sent, call.request)


def _lp_list(lp: Any) -> list:
    if not lp:
        return []
    if "content" in lp and lp["content"] is not None:
        return [None if e is None else e.get("logprob") for e in lp["content"]]
    if "token_logprobs" in lp and lp["token_logprobs"] is not None:
        return list(lp["token_logprobs"])
    return []


def _expected_plain(resp: dict, req: dict) -> dict:
    c0 = (resp.get("choices") or [{}])[0]
    prompt = resp.get("prompt_token_ids")
    if prompt is None:
        prompt = c0.get("prompt_token_ids")
    return {
        "prompt_ids": list(prompt or []),
        "response_ids": list(c0.get("token_ids") or []),
        "logprobs": _lp_list(c0.get("logprobs")),
        "message": c0.get("message") if "message" in c0 else {"role": "assistant", "content": c0.get("text")},
        "finish_reason": c0.get("finish_reason"),
        "model": resp.get("model"),
        "request_messages": req.get("messages"),
    }


def _expected_stream(chunks: list[dict], req: dict) -> dict:
    prompt, ids, lps, content, reasoning, tools = None, [], [], [], [], {}
    finish, model, role = None, None, "assistant"
    for ch in chunks:
        model = model or ch.get("model")
        if prompt is None and ch.get("prompt_token_ids") is not None:
            prompt = ch["prompt_token_ids"]
        for c in ch.get("choices") or []:
            if c.get("index", 0) != 0:
                continue
            if prompt is None and c.get("prompt_token_ids") is not None:
                prompt = c["prompt_token_ids"]
            ids.extend(c.get("token_ids") or [])
            lps.extend(_lp_list(c.get("logprobs")))
            d = c.get("delta") or {}
            role = d.get("role") or role
            if d.get("content"):
                content.append(d["content"])
            if c.get("text"):
                content.append(c["text"])
            r = d.get("reasoning_content") or d.get("reasoning")
            if r:
                reasoning.append(r)
            for tc in d.get("tool_calls") or []:
                slot = tools.setdefault(tc.get("index", 0), {"function": {"name": "", "arguments": ""}})
                if tc.get("id"):
                    slot["id"] = tc["id"]
                if tc.get("type"):
                    slot["type"] = tc["type"]
                fn = tc.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
            if c.get("finish_reason"):
                finish = c["finish_reason"]
    msg: dict = {"role": role, "content": "".join(content) if content else None}
    if reasoning:
        msg["reasoning_content"] = "".join(reasoning)
    if tools:
        msg["tool_calls"] = [tools[k] for k in sorted(tools)]
    return {
        "prompt_ids": list(prompt or []),
        "response_ids": ids,
        "logprobs": lps,
        "message": msg,
        "finish_reason": finish,
        "model": model,
        "request_messages": req.get("messages"),
    }


def main() -> None:
    """Run the stub as a process: prints its URL, serves until killed."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixtures", default=str(FIXTURES))
    ap.add_argument("--ready-file")
    args = ap.parse_args()
    stub = StubLLM(load_fixtures(pathlib.Path(args.fixtures))).start()
    if args.ready_file:
        pathlib.Path(args.ready_file).write_text(stub.url)
    print(stub.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        stub.stop()


if __name__ == "__main__":
    main()
