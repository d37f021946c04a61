"""A model that learns through rllm-pipe, on CPU, in minutes: the whole loop.

    python loop.py --bin ../../../bin/rllm-pipe --work /tmp/loop   (make loop)

with rllm_pipe installed (``pip install ./train/python``) or on PYTHONPATH
(``make loop`` sets ``PYTHONPATH=train/python``).

Five parts, each a real process talking over the public surfaces:

* a policy server (``loop.py policy``): a tiny numpy policy served
  OpenAI-compatibly (vLLM's response shape: prompt and response token ids,
  the sampled tokens' exact logprobs). It loads new weights when the
  trainer says so (POST /load).
* agents (``loop.py agents``): threads using the ``openai`` SDK through
  ``rllm-pipe gateway``. The task: guess the secret digit of a task. Turn
  one is a guess; the environment answers "higher", "lower" or "correct";
  turn two is the answer, rewarded 1 when right. A random policy scores 0.1.
* ``rllm-pipe gateway --to ROOT``: records every call, commits whole groups
  to the shard root, follows the trainer's published version, and paces new
  groups so that none is trained more than --max-staleness versions late.
* ``rllm-pipe serve --layout trajectories --batch-groups G``: the trainer's
  batches, G groups each (one optimizer step).
* the trainer (this process): GRPO with the PPO-clipped importance ratio
  against the behaviour logprobs, on ``PaddedBatches``. After each optimizer
  step it checkpoints, acknowledges the batch, loads the weights into the
  policy server and publishes the version (``publish_version``).

The trainer survives kill -9: it resumes from its checkpoint under the same
consumer name, and a batch whose groups it already trained on (the step
checkpointed, the acknowledgement lost) is acknowledged without training
again. It stops when the mean reward of the last --window batches reaches
--target, or at --deadline (exit 1), and writes the run's summary (JSON) and
``rllm-pipe report``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

# -- the toy tokenizer and chat template -------------------------------------

PAD = 0
DIGIT = 10  # digits 0..9 are ids 10..19
FEEDBACK = {"higher": 20, "lower": 21, "correct": 22}
TASK = 30  # task k is id 30 + k
ROLE = {"system": 40, "user": 41, "assistant": 42, "tool": 43}
END = 44
UNK = 45


def content_ids(text: str) -> list[int]:
    out, words = [], text.split()
    for i, w in enumerate(words):
        if i > 0 and words[i - 1] == "task" and w.isdigit():
            out[-1] = TASK + int(w)  # "task 3" is one token
        elif w.isdigit() and len(w) == 1:
            out.append(DIGIT + int(w))
        elif w in FEEDBACK:
            out.append(FEEDBACK[w])
        else:
            out.append(UNK)
    return out


def render(messages: list[dict]) -> list[int]:
    """The prompt ids of a conversation, generation prompt included: each
    message is its role, its content and END, as chat templates do."""
    ids: list[int] = []
    for m in messages:
        ids += [ROLE.get(m.get("role"), UNK), *content_ids(m.get("content") or ""), END]
    return ids + [ROLE["assistant"]]


# -- the policy ---------------------------------------------------------------

CONTEXTS = 1 + len(FEEDBACK)  # turn one, or turn two after each feedback


def state(ids, tasks: int) -> tuple[int, int]:
    """(task, context) of the next token after ids: the task token, and the
    last feedback so far (none: context 0)."""
    k, c = 0, 0
    for t in ids:
        t = int(t)
        if TASK <= t < TASK + tasks:
            k = t - TASK
        elif 20 <= t <= 22:
            c = 1 + t - 20
    return k, c


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


class PolicyServer:
    """OpenAI-compatible chat completions from logits theta[task, context]."""

    def __init__(self, tasks: int, seed: int):
        self.tasks = tasks
        self.theta = np.zeros((tasks, CONTEXTS, 10))
        self.version = 0
        self.rng = np.random.default_rng(seed)
        self.lock = threading.Lock()
        self.calls = 0

    def complete(self, req: dict) -> dict:
        prompt = render(req.get("messages") or [])
        k, c = state(prompt, self.tasks)
        with self.lock:
            lp = log_softmax(self.theta[k, c] / max(float(req.get("temperature") or 1.0), 1e-6))
            a = int(self.rng.choice(10, p=np.exp(lp)))
            self.calls += 1
        want_lp = req.get("logprobs") not in (None, False)
        want_ids = bool(req.get("return_token_ids"))
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": str(a)},
            "logprobs": {"content": [{"token": str(a), "logprob": float(lp[a]), "bytes": [48 + a], "top_logprobs": []}]} if want_lp else None,
            "finish_reason": "stop",
        }
        out = {"id": f"cmpl-{self.calls}", "object": "chat.completion", "created": int(time.time()), "model": "toy", "choices": [choice],
               "usage": {"prompt_tokens": len(prompt), "completion_tokens": 1, "total_tokens": len(prompt) + 1}}
        if want_ids:
            out["prompt_token_ids"], choice["token_ids"] = prompt, [DIGIT + a]
        return out

    def load(self, path: str, version: int) -> None:
        theta = np.load(path)
        with self.lock:
            self.theta, self.version = theta, int(version)


def serve_policy(args) -> None:
    policy = PolicyServer(args.tasks, args.seed)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):  # quiet
            pass

        def reply(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.reply(200, {"status": "ok", "version": policy.version} if self.path == "/health" else {"data": [{"id": "toy"}]})

        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            if n > 1 << 20:
                self.reply(413, {"error": "too large"})
                return
            body = json.loads(self.rfile.read(n) or b"{}")
            if self.path.endswith("/chat/completions"):
                self.reply(200, policy.complete(body))
            elif self.path == "/load":
                policy.load(body["path"], body["version"])
                self.reply(200, {"version": policy.version})
            else:
                self.reply(404, {"error": "not found"})

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    write_ready(args.ready, f"http://127.0.0.1:{srv.server_address[1]}")
    srv.serve_forever()


# -- the agents ---------------------------------------------------------------


def target(task: int, tasks: int) -> int:
    return (3 * task + 7) % 10


def serve_agents(args) -> None:
    """Threads running sessions of groups until killed: a group is a task
    tried --group-size times; each session is two chat calls."""
    import openai

    base = args.gateway.rstrip("/")
    counter = iter(range(1 << 62))
    lock = threading.Lock()
    rng = random.Random(args.seed)
    queue: list[tuple[str, int]] = []

    next_group = [time.monotonic()]  # --group-rate: when the next group may start

    def next_session() -> tuple[str, int]:
        with lock:
            if not queue:
                if args.group_rate > 0:
                    now = time.monotonic()
                    wait = next_group[0] - now
                    next_group[0] = max(next_group[0], now) + 1 / args.group_rate
                    if wait > 0:
                        time.sleep(wait)
                task, uid = rng.randrange(args.tasks), next(counter)
                queue.extend((f"t{task}-{args.seed}-{uid}:{i}", task) for i in range(args.group_size))
            return queue.pop(0)

    def finish(sid: str, reward: float) -> None:
        req = urllib.request.Request(f"{base}/sessions/{sid}/finish", data=json.dumps({"reward": reward}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        for attempt in range(60):
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    r.read()
                return
            except Exception:
                time.sleep(min(0.1 * 2**attempt, 2))

    def run() -> None:
        while True:
            sid, task = next_session()
            client = openai.OpenAI(base_url=f"{base}/sessions/{sid}/v1", api_key="none", max_retries=100, timeout=120)
            messages = [{"role": "system", "content": "guess the digit"}, {"role": "user", "content": f"task {task}"}]
            try:
                guess = client.chat.completions.create(model="toy", messages=messages, temperature=1.0, max_tokens=1).choices[0].message.content
                want = target(task, args.tasks)
                g = int(guess)
                fb = "correct" if g == want else ("higher" if g < want else "lower")
                messages += [{"role": "assistant", "content": guess}, {"role": "user", "content": fb}]
                answer = client.chat.completions.create(model="toy", messages=messages, temperature=1.0, max_tokens=1).choices[0].message.content
                finish(sid, 1.0 if int(answer) == want else 0.0)
            except Exception as e:  # the gateway restarting: the session is recorded as far as it got
                print(f"agents: session {sid}: {type(e).__name__}: {e}", file=sys.stderr)
                time.sleep(0.5)

    for _ in range(args.threads):
        threading.Thread(target=run, daemon=True).start()
    threading.Event().wait()


# -- the trainer --------------------------------------------------------------


class Checkpoint:
    """The trainer's state, saved after every optimizer step before its
    acknowledgement: weights, Adam moments, version, and the groups that
    step trained on (a batch redelivered after a crash is not trained on
    twice)."""

    def __init__(self, folder: pathlib.Path, tasks: int):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.theta = np.zeros((tasks, CONTEXTS, 10))
        self.m = np.zeros_like(self.theta)
        self.v = np.zeros_like(self.theta)
        self.version = 0
        self.steps = 0
        self.lines = 0  # lines of steps.jsonl this state accounts for
        self.trained: set[str] = set()
        # The gradient accumulated over the batches of the optimizer step
        # under way, its tokens and groups.
        self.acc = np.zeros_like(self.theta)
        self.acc_tokens = self.acc_groups = 0
        meta = folder / "state.json"
        if meta.exists():
            s = json.loads(meta.read_text())
            arrays = np.load(folder / s["arrays"])
            self.theta, self.m, self.v, self.acc = arrays["theta"], arrays["m"], arrays["v"], arrays["acc"]
            self.version, self.steps, self.lines, self.trained = s["version"], s["steps"], s["lines"], set(s["trained"])
            self.acc_tokens, self.acc_groups = s["acc_tokens"], s["acc_groups"]

    def save(self) -> str:
        """Saves atomically; returns the weights file for the policy server."""
        name = f"state-{self.version}-{self.lines}.npz"
        tmp = self.folder / (name + ".tmp")
        with open(tmp, "wb") as f:
            np.savez(f, theta=self.theta, m=self.m, v=self.v, acc=self.acc)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.folder / name)
        weights = self.folder / f"theta-{self.version}.npy"
        np.save(weights, self.theta)
        meta = {"arrays": name, "version": self.version, "steps": self.steps, "lines": self.lines, "trained": sorted(self.trained),
                "acc_tokens": self.acc_tokens, "acc_groups": self.acc_groups}
        tmp = self.folder / "state.json.tmp"
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, self.folder / "state.json")
        for old in self.folder.glob("state-*.npz"):
            if old.name != name:
                old.unlink(missing_ok=True)
        for old in self.folder.glob("theta-*.npy"):
            if old.name != weights.name and int(old.stem.split("-")[1]) < self.version - 2:
                old.unlink(missing_ok=True)
        return str(weights)


def accumulate(ck: Checkpoint, p, keep: np.ndarray, tasks: int, clip: float) -> dict:
    """Adds the gradient of GRPO's loss with the PPO-clipped ratio against
    the behaviour logprobs, over the rows in keep, to the step's
    accumulator (token-mean over the step, applied by optimizer_step())."""
    grad = ck.acc
    tokens = clipped = 0
    ratios = []
    for r in np.flatnonzero(keep):
        prompt = p.prompts[r][p.attention_mask[r, : p.prompts.shape[1]] == 1]
        seq = list(prompt)
        for j in range(p.responses.shape[1]):
            if p.response_mask[r, j] == 0:
                if p.attention_mask[r, p.prompts.shape[1] + j] == 1:
                    seq.append(int(p.responses[r, j]))  # an observation token
                continue
            tok = int(p.responses[r, j])
            k, c = state(seq, tasks)
            seq.append(tok)
            a = tok - DIGIT
            lp = log_softmax(ck.theta[k, c])
            ratio = float(np.exp(lp[a] - p.rollout_log_probs[r, j]))
            adv = float(p.advantages[r, j])
            ratios.append(ratio)
            tokens += 1
            if (adv > 0 and ratio > 1 + clip) or (adv < 0 and ratio < 1 - clip):
                clipped += 1
                continue  # the clipped branch has no gradient
            g = -np.exp(lp)
            g[a] += 1.0
            grad[k, c] -= adv * ratio * g  # d(-ratio * adv)/d logits
    ck.acc_tokens += tokens
    return {"tokens": tokens, "clipped": clipped, "ratio_mean": float(np.mean(ratios)) if ratios else 1.0}


def optimizer_step(ck: Checkpoint, lr: float) -> None:
    """The optimizer step (Adam) on the accumulated gradient; a new version."""
    if ck.acc_tokens:
        grad = ck.acc / ck.acc_tokens
        ck.steps += 1
        b1, b2 = 0.9, 0.999
        ck.m = b1 * ck.m + (1 - b1) * grad
        ck.v = b2 * ck.v + (1 - b2) * grad * grad
        mh, vh = ck.m / (1 - b1**ck.steps), ck.v / (1 - b2**ck.steps)
        ck.theta -= lr * mh / (np.sqrt(vh) + 1e-8)
    ck.version += 1
    ck.acc = np.zeros_like(ck.theta)
    ck.acc_tokens = ck.acc_groups = 0


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def train(args) -> int:
    """The trainer: batches from serve, one optimizer step each."""
    from rllm_pipe import PaddedBatches

    ck = Checkpoint(pathlib.Path(args.work) / "trainer", args.tasks)
    if ck.version > 0:  # a restart: the policy serves the checkpoint's weights
        post(f"{args.policy}/load", {"path": ck.save(), "version": ck.version})
    # The step log holds what the checkpoint accounts for: a line written
    # by a step whose checkpoint did not land is cut.
    log_path = pathlib.Path(args.work) / "steps.jsonl"
    kept = log_path.read_text().splitlines(keepends=True)[: ck.lines] if log_path.exists() else []
    log_path.write_text("".join(kept))
    log = open(log_path, "a")
    ds = PaddedBatches(args.serve, consumer="trainer", pad_token_id=PAD, max_prompt_length=32, max_response_length=16,
                       policy_version=ck.version)
    start, rewards = time.monotonic(), []
    published = False
    for step in ds:
        p = step.padded
        if not published:
            ds.publish_version(ck.version)  # the served version, once the stream is open
            published = True
        groups = p.ids["group_ids"]
        keep = p.is_valid & ~np.isin(groups, list(ck.trained))
        stats = accumulate(ck, p, keep, args.tasks, args.clip) if keep.any() else {"tokens": 0}
        ck.acc_groups += len(set(groups[keep].tolist()))
        if args.seconds_per_group > 0:  # benchmarks: a trainer of a given speed
            time.sleep(args.seconds_per_group * len(set(groups[p.is_valid].tolist())))
        real = p.is_valid
        batch_reward = float(p.traj_rewards[real].max(axis=1).mean()) if real.any() else 0.0
        staleness = step.staleness
        # An optimizer step once --groups-per-step groups are in (the
        # pacing's assumption: a version per that many groups).
        stepped = ck.acc_groups >= args.groups_per_step
        if stepped:
            optimizer_step(ck, args.lr)
        if keep.any():
            ck.trained = set(groups[keep].tolist())
        wall = time.monotonic() - start
        rec = {"version": ck.version, "groups": len(set(groups[real].tolist())), "trained_groups": sorted(set(groups[keep].tolist())),
               "retrained_skipped": int((p.is_valid & ~keep).sum()),
               "reward": batch_reward, "staleness_max": staleness["max"], "stall": ds.stall, "freshness_p99_ms": ds.freshness()["p99_ms"],
               "wall_s": round(wall, 2), **stats}
        log.write(json.dumps(rec) + "\n")
        log.flush()
        ck.lines += 1
        # Checkpoint before the acknowledgement: after a crash between
        # them the batch comes back, and its groups in ck.trained are not
        # trained again.
        weights = ck.save()
        if os.environ.get("LOOP_KILL_AT_VERSION") == str(ck.version) and keep.any():  # tests: the worst moment to die
            os.kill(os.getpid(), signal.SIGKILL)
        step.ack(policy_version=ck.version)
        if stepped:
            post(f"{args.policy}/load", {"path": weights, "version": ck.version})
            ds.publish_version(ck.version)
        rewards.append(batch_reward)
        mean = float(np.mean(rewards[-args.window :]))
        print(f"v{ck.version:4d} reward {batch_reward:.2f} (last {min(len(rewards), args.window)}: {mean:.2f}) "
              f"staleness {staleness['max']} stall {rec['stall']:.0%} {wall:5.1f}s", flush=True)
        reached = len(rewards) >= args.window and mean >= args.target and args.duration <= 0
        late = wall > (args.duration if args.duration > 0 else args.deadline)
        if reached or late:
            summary = {"reached": reached, "mean_reward": mean, "version": ck.version, "wall_s": wall, **ds.loop_stats()}
            (pathlib.Path(args.work) / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
            f = summary["freshness"]
            print(f"loop: mean reward {mean:.2f} {'>=' if reached else '<'} {args.target} at version {ck.version} after {wall:.0f}s; "
                  f"stall {summary['stall']:.0%}, freshness p50 {f['p50_ms']:.0f} ms p99 {f['p99_ms']:.0f} ms, "
                  f"staleness max {summary['staleness_max']}, skipped stale {summary.get('groups_skipped_stale', 0)}", flush=True)
            return 0 if reached or args.duration > 0 else 1
    return 1


# -- running it all -----------------------------------------------------------


def note_gateway(gateway: str, summary: pathlib.Path) -> None:
    """Adds the gateway's pacing counters to the run's summary."""
    try:
        with urllib.request.urlopen(gateway + "/metrics", timeout=10) as r:
            text = r.read().decode()
        s = json.loads(summary.read_text())
    except Exception:
        return
    s["gateway"] = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                    if line.startswith(("rllm_gateway_pace_", "rllm_gateway_weight_version ")) and len(line.split()) == 2}
    summary.write_text(json.dumps(s, indent=1) + "\n")


def write_ready(path: str, text: str) -> None:
    tmp = path + ".tmp"
    pathlib.Path(tmp).write_text(text + "\n")
    os.replace(tmp, path)


def wait_ready(path: pathlib.Path, proc: subprocess.Popen, what: str, timeout: float = 60) -> str:
    deadline = time.time() + timeout
    while not (path.exists() and path.read_text().endswith("\n")):
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        if time.time() > deadline:
            raise TimeoutError(f"{what} did not start")
        time.sleep(0.05)
    return path.read_text().strip()


def stop_all(procs: list[subprocess.Popen]) -> None:
    """Stops procs last started first (agents before the gateway before
    the policy server): SIGTERM to each process group, SIGKILL after 60 s."""
    for p in reversed(procs):
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def start(cmd: list[str], log: pathlib.Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "ab"), start_new_session=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", nargs="?", default="all", choices=["all", "policy", "agents", "train"])
    ap.add_argument("--bin", default="bin/rllm-pipe", help="the rllm-pipe binary")
    ap.add_argument("--work", default=".loop", help="working folder (the shard root is WORK/data); emptied first")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--groups-per-step", type=int, default=4)
    ap.add_argument("--max-staleness", type=int, default=1)
    ap.add_argument("--threads", type=int, default=32, help="agent threads")
    ap.add_argument("--flush-interval", default="200ms")
    ap.add_argument("--lr", type=float, default=0.3)
    ap.add_argument("--clip", type=float, default=0.2)
    ap.add_argument("--target", type=float, default=0.9)
    ap.add_argument("--window", type=int, default=10, help="batches the target's mean reward is over")
    ap.add_argument("--deadline", type=float, default=300, help="seconds")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pacing", action=argparse.BooleanOptionalAction, default=True, help="the gateway's pacing (--groups-per-step)")
    ap.add_argument("--serve-max-staleness", type=int, default=-1, help="serve's --max-staleness: staler groups are skipped")
    ap.add_argument("--group-rate", type=float, default=0, help="agents start at most this many groups a second (0: as fast as they can)")
    ap.add_argument("--seconds-per-group", type=float, default=0, help="the trainer's simulated compute per group it trains on (benchmarks: its demand is 1/this groups a second)")
    ap.add_argument("--duration", type=float, default=0, help="run this long, whatever the reward (benchmarks)")
    ap.add_argument("--ready", help=argparse.SUPPRESS)
    ap.add_argument("--gateway", help=argparse.SUPPRESS)
    ap.add_argument("--policy", help=argparse.SUPPRESS)
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "policy":
        serve_policy(args)
        return 0
    if args.role == "agents":
        serve_agents(args)
        return 0
    if args.role == "train":
        return train(args)

    work = pathlib.Path(args.work).resolve()
    if work.exists():
        subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir(parents=True)
    root, me = work / "data", [sys.executable, os.path.abspath(__file__)]
    procs: list[subprocess.Popen] = []
    try:
        p = start([*me, "policy", "--tasks", str(args.tasks), "--seed", str(args.seed), "--ready", str(work / "policy.ready")], work / "policy.log")
        procs.append(p)
        policy = wait_ready(work / "policy.ready", p, "policy server")
        p = start([args.bin, "gateway", "--upstream", policy, "--to", str(root), "--listen", "127.0.0.1:0", "--ready-file", str(work / "gateway.ready"),
                   "--group-size", str(args.group_size), "--flush-interval", args.flush_interval,
                   *(["--groups-per-step", str(args.groups_per_step), "--max-staleness", str(args.max_staleness)] if args.pacing else []),
                   "--trainer-poll", "100ms", "--pace-wait", "120s"], work / "gateway.log")
        procs.append(p)
        gateway = "http://" + wait_ready(work / "gateway.ready", p, "gateway")
        p = start([args.bin, "serve", "--from", str(root), "--listen", "127.0.0.1:0", "--ready-file", str(work / "serve.ready"),
                   "--layout", "trajectories", "--batch-groups", str(args.groups_per_step), "--poll", "100ms",
                   "--max-inflight", "2", "--max-staleness", str(args.serve_max_staleness)], work / "serve.log")
        procs.append(p)
        serve = "grpc://" + wait_ready(work / "serve.ready", p, "serve")
        procs.append(start([*me, "agents", "--gateway", gateway, "--threads", str(args.threads), "--tasks", str(args.tasks),
                            "--group-size", str(args.group_size), "--seed", str(args.seed), "--group-rate", str(args.group_rate)], work / "agents.log"))
        print(f"loop: policy {policy}, gateway {gateway}, serve {serve}; logs in {work}", flush=True)
        args.policy, args.serve = policy, serve
        args.work = str(work)
        code = train(args)
        note_gateway(gateway, work / "summary.json")
    finally:
        stop_all(procs)
    subprocess.run([args.bin, "report", "--from", str(root), "--to", str(work / "report.html")], check=False)
    print(f"loop: report {work / 'report.html'}, steps {work / 'steps.jsonl'}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
