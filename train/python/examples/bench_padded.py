"""Merged, padded batches delivered to Python: rllm-pipe's way (serve --layout
trajectories + Batch.to_padded) next to the same work done in Python from step
rows (serve --layout steps), in the same run on the same data.

    pip install ./train/python    # or PYTHONPATH=train/python (examples/bench.sh sets it)
    python train/python/examples/bench_padded.py [--groups 64] [--rounds 3] [--bin PATH] [--baseline-bin PATH]
    python train/python/examples/bench_padded.py --trajectory-tokens 8192 --batch-trajectories 512 --groups 96

--trajectory-tokens N generates trajectories of about N tokens each (merged:
the first prompt, then every action and observation), and
--batch-trajectories M sets the batch budget to M + 8 times the tokens per
trajectory measured on the data, so that batches hold about M trajectories
(whole groups of 16, so a group more or fewer); the figure a trainer step
needs is then the ms per batch (and per M trajectories).

The Python contenders do what rLLM's verl transform does
(rllm/trainer/verl/transform.py), per trajectory: a step whose prompt starts
with the running sequence extends the row (observation tokens with mask 0 and
logprob 0, then the action tokens), any other step starts a new row; then
prompts are left-padded and responses right-padded row by row, and the
attention mask, position ids and masked advantages are computed on the whole
batch with numpy. "python (lists)" is rLLM's code shape (the needed columns
as Python lists); "python (numpy views)" compares and copies tokens as numpy
views of the Arrow buffers, the fastest of the two.

With --baseline-bin, another rllm-pipe binary (an earlier build) serves the
same data as one more contender, so that a change to the serving side is
measured against its predecessor in the same run.

Before timing, every contender's tensors are checked equal, row by row, to
rllm-pipe's (keyed by trajectory and first step). Then the contenders run
--rounds times, alternating, each round a fresh consumer group of a fresh
serve; the time of a round runs from opening the stream to the last batch
padded and acknowledged. Printed: the median and the spread (min-max) of
rows/s, trajectories/s, tokens/s (tokens kept after truncation), ms per
batch (the round's time over its batches), per 512 trajectories and per
512 rows, the time the
client spent padding (the rest is waiting for the server), and the speed-up
over each Python contender (median of the per-round ratios, with its
spread).
"""

import argparse
import hashlib
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

from rllm_pipe import Client
from train_tiny import find_bin  # beside this script, on sys.path when it runs

HERE = pathlib.Path(__file__).resolve()

PAD = 151643  # Qwen's <|endoftext|>, outside the generated vocabulary
STEP_COLUMNS = ["group_id", "trajectory_id", "step_index", "prompt_ids", "response_ids", "response_logprobs",
                "advantage", "token_advantages", "reward"]


# --- the Python contenders ---------------------------------------------------


def _trajectories(record):
    """The step row indices of each trajectory, in step order."""
    gid, tid = record.column("group_id").to_pylist(), record.column("trajectory_id").to_pylist()
    idx = record.column("step_index").to_pylist()
    by = {}
    for i, key in enumerate(zip(gid, tid)):
        by.setdefault(key, []).append(i)
    return [sorted(rows, key=idx.__getitem__) for rows in by.values()]


def merge_lists(record):
    """rLLM's merge with Python lists: rows of (trajectory, first step,
    prompt, response, mask, logprobs, advantages, reward)."""
    cols = record.select(STEP_COLUMNS).to_pydict()
    rows = []
    for steps in _trajectories(record):
        seg = full = None
        for i in steps:
            p, a, lp = cols["prompt_ids"][i], cols["response_ids"][i], cols["response_logprobs"][i]
            ta = cols["token_advantages"][i]
            adv = ta if ta is not None else [cols["advantage"][i]] * len(a)
            if seg is not None and len(p) >= len(full) and p[: len(full)] == full:
                obs = p[len(full):]
                seg[3] += obs + a
                seg[4] += [0] * len(obs) + [1] * len(a)
                seg[5] += [0.0] * len(obs) + lp
                seg[6] += [0.0] * len(obs) + adv
                full += obs + a
            else:
                if seg is not None:
                    rows.append(seg)
                seg = [cols["trajectory_id"][i], cols["step_index"][i], p, list(a), [1] * len(a), list(lp), list(adv),
                       cols["reward"][i]]
                full = p + a
        rows.append(seg)
    return rows


def merge_numpy(batch):
    """The same merge with numpy views of the Arrow buffers: the prefix test
    and the copies run in numpy, one trajectory step at a time."""
    rec = batch.record
    pr, rs, lps = batch.tokens("prompt_ids"), batch.tokens("response_ids"), batch.tokens("response_logprobs")
    adv = rec.column("advantage").to_numpy()
    tok = rec.column("token_advantages")
    tok_null = tok.is_null().to_numpy(zero_copy_only=False)
    tok_v, tok_o = tok.values.to_numpy(zero_copy_only=False), tok.offsets.to_numpy(zero_copy_only=False)
    tid, idx, reward = rec.column("trajectory_id").to_pylist(), rec.column("step_index").to_pylist(), rec.column("reward").to_pylist()
    rows = []

    def close(seg):
        parts = list(zip(*seg[3]))
        rows.append([seg[0], seg[1], seg[2]] + [np.concatenate(p) for p in parts] + [seg[4]])

    for steps in _trajectories(rec):
        seg = prev = None
        for i in steps:
            p, a = pr.row(i), rs.row(i)
            ta = np.full(len(a), adv[i], np.float32) if tok_null[i] else tok_v[tok_o[i]:tok_o[i + 1]]
            if prev is not None:
                pp, pa_ = pr.row(prev), rs.row(prev)
                n = len(pp) + len(pa_)
            if prev is not None and len(p) >= n and np.array_equal(p[:len(pp)], pp) and np.array_equal(p[len(pp):n], pa_):
                obs = p[n:]
                z = np.zeros(len(obs), np.float32)
                seg[3].append((obs, np.zeros(len(obs), np.int8), z, z))
                seg[3].append((a, np.ones(len(a), np.int8), lps.row(i), ta))
            else:
                if seg is not None:
                    close(seg)
                seg = [tid[i], idx[i], p, [(a, np.ones(len(a), np.int8), lps.row(i), ta)], reward[i]]
            prev = i
        close(seg)
    return rows


def pad_rows(rows, P, R):
    """verl's padding, row by row, as rLLM's transform does it; the masks and
    positions over the whole batch."""
    n = len(rows)
    input_ids = np.full((n, P + R), PAD, dtype=np.int64)
    mask = np.zeros((n, R), dtype=np.int64)
    lp = np.zeros((n, R), dtype=np.float32)
    adv = np.zeros((n, R), dtype=np.float32)
    traj_rewards = np.zeros((n, R), dtype=np.float32)
    for i, (_, _, p, r, m, l, a, reward) in enumerate(rows):
        p = p[-P:]
        input_ids[i, P - len(p):P] = p
        k = min(len(r), R)
        input_ids[i, P:P + k], mask[i, :k], lp[i, :k], adv[i, :k] = r[:k], m[:k], l[:k], a[:k]
        if 0 < len(r) <= R:
            traj_rewards[i, len(r) - 1] = reward
    attention_mask = (input_ids != PAD).astype(np.int64)
    position_ids = (np.cumsum(attention_mask, axis=1) - 1) * attention_mask
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids, "response_mask": mask,
            "rollout_log_probs": lp, "advantages": adv * mask, "traj_rewards": traj_rewards}, [(r[0], r[1]) for r in rows]


# --- the contenders: batch -> (rows, tokens, tensors, row keys) ---------------


def rllm_pipe_way(P, R):
    """to_padded into the previous batch's arrays (PaddedBatches(reuse_arrays=True))."""
    state = {"prev": None}

    def pad(b):
        p = b.to_padded(PAD, P, R, warn=False, out=state["prev"])
        state["prev"] = p  # the trainer is done with it once the batch is acknowledged
        for k in CUT:
            CUT[k] += p.truncation[k]
        keys = list(zip(p.ids["trajectory_ids"], p.ids["first_step_index"]))
        return p.num_rows, int(p.attention_mask.sum()), {**p.arrays()}, keys

    return pad


def python_way(merge, P, R):
    def pad(b):
        t, keys = pad_rows(merge(b.record if merge is merge_lists else b), P, R)
        return len(keys), int(t["attention_mask"].sum()), t, keys

    return pad


CONTENDERS = {
    "rllm-pipe (Go merge + to_padded)": ("trajectories", lambda P, R: rllm_pipe_way(P, R)),
    "python (lists)": ("steps", lambda P, R: python_way(merge_lists, P, R)),
    "python (numpy views)": ("steps", lambda P, R: python_way(merge_numpy, P, R)),
}
CUT = {"rows": 0, "prompts_truncated": 0, "responses_truncated": 0}  # rllm-pipe's to_padded, summed
CHECKED = ("input_ids", "attention_mask", "position_ids", "response_mask", "rollout_log_probs", "advantages", "traj_rewards")


# --- running -----------------------------------------------------------------


BASELINE = "rllm-pipe at --baseline-bin"


def serve(bin_, out, work, layout, max_tokens):
    ready = work / f"ready-{time.monotonic_ns()}"
    proc = subprocess.Popen([bin_, "serve", "--from", str(out), "--listen", "127.0.0.1:0", "--ready-file", str(ready),
                             "--follow=false", "--poll", "50ms", "--consumer-group", f"{layout}-{time.monotonic_ns()}",
                             "--layout", layout, "--max-tokens", str(max_tokens)], stderr=subprocess.DEVNULL)
    while not (ready.exists() and ready.read_text().strip()):
        if proc.poll() is not None:
            sys.exit("serve exited")
        time.sleep(0.05)
    return proc, "grpc://" + ready.read_text().strip()


class Round:
    """One contender's drain of the server."""

    def __init__(self):
        self.rows = self.tokens = self.budget = self.batches = 0
        self.secs = self.busy = 0.0
        self.trajectories = []  # per batch


def consume(location, fn, each=None):
    """Drains the server through fn: rows, tokens, seconds in all, seconds in
    fn, batches, trajectories per batch, and the tokens the server counted
    against its budget."""
    r = Round()
    t0 = time.perf_counter()
    with Client(location, consumer="bench") as c:
        for b in c.batches():
            t1 = time.perf_counter()
            n, t, tensors, keys = fn(b)
            if each is not None:
                each(tensors, keys)
            r.busy += time.perf_counter() - t1
            r.rows += n
            r.tokens += t
            r.budget += b.tokens_total
            r.batches += 1
            r.trajectories.append(len({k[0] for k in keys}))
            b.ack()
    r.secs = time.perf_counter() - t0
    return r


def digests(out):
    def each(tensors, keys):
        for i, key in enumerate(keys):
            h = hashlib.sha256()
            for name in CHECKED:
                h.update(np.ascontiguousarray(tensors[name][i], dtype=np.float32 if tensors[name].dtype.kind == "f" else np.int64))
            out[key] = h.hexdigest()

    return each


def spread(xs, fmt):
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=64, help="groups of 16 trajectories")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bin")
    ap.add_argument("--baseline-bin", help="an earlier rllm-pipe binary, run as one more contender")
    ap.add_argument("--max-tokens", type=int, default=4_200_000, help="batch budget of merged rows (ignored with --batch-trajectories)")
    ap.add_argument("--trajectory-tokens", type=int, default=0,
                    help="generate trajectories of about this many tokens (0: 12-22 turns, about 10k)")
    ap.add_argument("--batch-trajectories", type=int, default=0,
                    help="set the budget so that a batch holds about this many trajectories (measured tokens per trajectory)")
    ap.add_argument("--max-prompt-length", type=int, default=2048)
    ap.add_argument("--max-response-length", type=int,
                    help="default 8192, or with --trajectory-tokens N the first multiple of 1024 over 1.5 N - 1024")
    args = ap.parse_args()
    # Turns of a generated trajectory: a first prompt of ~1024 tokens, then
    # ~500 tokens (a 300-token action and a 200-token observation) per turn.
    turns = "12..22"
    if args.trajectory_tokens:
        mid = max(2, round((args.trajectory_tokens - 1024) / 500))
        turns = f"{max(1, mid - 4)}..{mid + 4}"
    if args.max_response_length is None:
        args.max_response_length = 8192
        if args.trajectory_tokens:  # room for the long tail: rows cut are reported
            args.max_response_length = -(-(args.trajectory_tokens * 3 // 2 - 1024) // 1024) * 1024
    bin_ = find_bin(args.bin)
    contenders = dict(CONTENDERS)
    bins = {}
    if args.baseline_bin:
        contenders[BASELINE] = CONTENDERS[next(iter(CONTENDERS))]
        bins[BASELINE] = args.baseline_bin
    P, R = args.max_prompt_length, args.max_response_length
    pa.array([1]).to_numpy(zero_copy_only=False)  # one-time imports out of the timing
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        run = lambda *a: subprocess.run([bin_, *a], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        run("gen", "--groups", str(args.groups), "--group-size", "16", "--turns", turns, "--resets", "0.02",
            "--observation-len", "200", "--prompt-len", "1024", "--response-len", "300", "--to", str(work / "t.jsonl"), "--quiet")
        run("ingest", "--from", str(work / "t.jsonl"), "--to", str(work / "out"), "--group-size", "16", "--quiet")

        budget = {"trajectories": args.max_tokens}

        fns = {}  # one per contender for the whole run, as in a trainer process

        def once(name, each=None):
            layout, make = contenders.get(name, (name, None))
            if name not in fns:
                fns[name] = make(P, R) if make else lambda b: (0, 0, {}, [])
            fn = fns[name]
            proc, loc = serve(bins.get(name, bin_), work / "out", work, layout, budget[layout])
            try:
                return consume(loc, fn, each)
            finally:
                proc.terminate()
                proc.wait(10)

        # Checked equal first (untimed; also warms every path up).
        # The budget of step rows counts every step's whole prompt: scaled so
        # that the Python contenders get batches of as many trajectories.
        want = {}
        first = once(next(iter(contenders)), digests(want))
        cut = dict(CUT)  # rows to_padded cut in one pass over the data
        merged_tokens = first.budget
        trajectories = sum(first.trajectories)
        per_trajectory = merged_tokens / trajectories
        if args.batch_trajectories:  # half a group of slack: batches of M trajectories, give or take a group
            budget["trajectories"] = args.max_tokens = int((args.batch_trajectories + 8) * per_trajectory)
        budget["steps"] = args.max_tokens
        step_tokens = once("steps").budget
        budget["steps"] = int(args.max_tokens * step_tokens / merged_tokens)
        for name in list(contenders)[1:]:
            got = {}
            once(name, digests(got))
            if got != want:
                bad = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
                sys.exit(f"{name}: {len(bad)} of {len(want)} rows differ from rllm-pipe's, e.g. {bad[:3]}")
        print(f"data: {args.groups} groups of 16, turns {turns}: {trajectories} trajectories of {per_trajectory:,.0f} tokens "
              f"on average ({first.rows} merged rows; {first.budget:,} tokens)")
        print(f"budgets: {budget} (step rows hold {step_tokens / merged_tokens:.1f}x the tokens of merged rows)")
        print(f"checked: the {len(contenders)} contenders' tensors are equal on all {len(want)} rows "
              f"({', '.join(CHECKED)})")

        results = {name: [] for name in contenders}
        for r in range(args.rounds):
            names = list(contenders) if r % 2 == 0 else list(contenders)[::-1]
            for name in names:
                results[name].append(once(name))
        print(f"{args.rounds} rounds, alternating; median (min-max); P={P} R={R}; truncation: {cut}")
        for name, rs in results.items():
            r0 = rs[0]
            rows, tokens, batches = r0.rows, r0.tokens, r0.batches
            secs = [r.secs for r in rs]
            busy = [r.busy for r in rs]
            tpb = r0.trajectories
            print(f"{name:34s} {rows} rows {tokens} tokens ({tokens / rows:,.0f}/row) in {batches} batches of "
                  f"{statistics.mean(tpb):.0f} ({min(tpb)}-{max(tpb)}) trajectories:\n    "
                  f"{spread([rows / s for s in secs], '{:,.0f}')} rows/s, {spread([trajectories / s for s in secs], '{:,.0f}')} trajectories/s, "
                  f"{spread([tokens / s / 1e6 for s in secs], '{:.2f}')} M tokens/s, "
                  f"{spread([s / batches * 1e3 for s in secs], '{:,.0f}')} ms per batch, "
                  f"{spread([s / trajectories * 512 * 1e3 for s in secs], '{:,.0f}')} ms per 512 trajectories, "
                  f"{spread([s / rows * 512 * 1e3 for s in secs], '{:,.0f}')} ms per 512 rows "
                  f"(padding {spread([b / batches * 1e3 for b in busy], '{:,.0f}')} ms per batch)")
        ours = results[next(iter(contenders))]
        for name in list(contenders)[1:]:
            ratios = [theirs.secs / mine.secs for theirs, mine in zip(results[name], ours)]
            client = [theirs.busy / mine.busy for theirs, mine in zip(results[name], ours)]
            print(f"speed-up over {name}: {spread(ratios, '{:.1f}')}x end to end (lowest {min(ratios):.1f}x), "
                  f"{spread(client, '{:.1f}')}x in the client's padding")


if __name__ == "__main__":
    main()
