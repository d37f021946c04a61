"""Merged, padded batches delivered to Python: rllm-pipe's way (serve --layout
trajectories + Batch.to_padded) next to the way a user writes it today (serve
step rows, merge trajectories in Python as rLLM does, pad row by row), in the
same run on the same data.

    python train/python/examples/bench_padded.py [--groups 32] [--bin PATH]

Prints rows/s and tokens/s of both, and the time per batch of --batch-rows
trajectories of ~8k tokens.
"""

import argparse
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

HERE = pathlib.Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE.parent))

from rllm_pipe import Client  # noqa: E402
from train_tiny import find_bin  # noqa: E402

PAD = 151643


def python_way(batch, P, R):
    """What a trainer writes today from step rows: rLLM's merge in Python
    lists, then verl's padding row by row."""
    rows, seg, full, key = [], None, None, None
    for s in batch.record.to_pylist():
        p, a = s["prompt_ids"], s["response_ids"]
        if seg is not None and key == (s["group_id"], s["trajectory_id"]) and len(p) >= len(full) and p[: len(full)] == full:
            obs = p[len(full):]
            seg[1].extend(obs + a)
            seg[2].extend([0] * len(obs) + [1] * len(a))
            seg[3].extend([0.0] * len(obs) + s["response_logprobs"])
            seg[4].extend([0.0] * len(obs) + [s["advantage"]] * len(a))
            full += obs + a
        else:
            if seg is not None:
                rows.append(seg)
            seg = [p, list(a), [1] * len(a), list(s["response_logprobs"]), [s["advantage"]] * len(a)]
            full, key = p + a, (s["group_id"], s["trajectory_id"])
    rows.append(seg)
    n = len(rows)
    prompts = np.full((n, P), PAD, dtype=np.int64)
    resp = np.full((n, R), PAD, dtype=np.int64)
    mask = np.zeros((n, R), dtype=np.int64)
    lp = np.zeros((n, R), dtype=np.float32)
    adv = np.zeros((n, R), dtype=np.float32)
    for i, (p, r, m, l, a) in enumerate(rows):
        p = p[-P:]
        prompts[i, P - len(p):] = p
        k = min(len(r), R)
        resp[i, :k], mask[i, :k], lp[i, :k], adv[i, :k] = r[:k], m[:k], l[:k], a[:k]
    ids = np.concatenate([prompts, resp], axis=1)
    att = (ids != PAD).astype(np.int64)
    pos = (np.cumsum(att, axis=1) - 1) * att
    return n, int(att.sum()), (ids, att, pos, mask, lp, adv * mask)


def serve(bin_, out, work, *flags):
    ready = work / f"ready-{time.monotonic_ns()}"
    proc = subprocess.Popen([bin_, "serve", "--from", str(out), "--listen", "127.0.0.1:0", "--ready-file", str(ready),
                             "--follow=false", "--poll", "50ms", *flags], stderr=subprocess.DEVNULL)
    while not (ready.exists() and ready.read_text().strip()):
        time.sleep(0.05)
    return proc, "grpc://" + ready.read_text().strip()


def measure(location, fn):
    rows = tokens = 0
    t0 = time.perf_counter()
    with Client(location, consumer="bench") as c:
        for b in c.batches():
            n, t = fn(b)
            rows += n
            tokens += t
            b.ack()
    return rows, tokens, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--bin")
    ap.add_argument("--max-tokens", default="4200000")
    args = ap.parse_args()
    bin_ = find_bin(args.bin)
    pa.array([1]).to_numpy(zero_copy_only=False)  # one-time imports out of the timing
    P, R = 2048, 8192
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        run = lambda *a: subprocess.run([bin_, *a], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        run("gen", "--groups", str(args.groups), "--group-size", "16", "--turns", "10..20", "--resets", "0.02", "--observation-len", "200",
            "--prompt-len", "1024", "--response-len", "300", "--out", str(work / "t.jsonl"), "--quiet")
        run("ingest", "--from", str(work / "t.jsonl"), "--to", str(work / "out"), "--group-size", "16", "--quiet")

        def go_way(b):
            p = b.to_padded(PAD, P, R, warn=False)
            return p.num_rows, int(p.attention_mask.sum())

        results = {}
        for name, layout, fn in [("rllm-pipe (Go merge + to_padded)", "trajectories", go_way),
                                 ("Python from step rows", "steps", lambda b: python_way(b, P, R)[:2])]:
            proc, loc = serve(bin_, work / "out", work, "--consumer-group", layout, "--layout", layout, "--max-tokens", args.max_tokens)
            try:
                results[name] = measure(loc, fn)
            finally:
                proc.terminate()
                proc.wait(10)
        base = None
        for name, (rows, tokens, secs) in results.items():
            per512 = secs / rows * 512
            print(f"{name:36s} {rows} rows {tokens} tokens in {secs:.2f}s: {rows / secs:,.0f} rows/s {tokens / secs:,.0f} tokens/s; "
                  f"{per512:.2f}s per 512 rows ({tokens / rows:,.0f} tokens/row)")
            base = base or secs
        (_, _, a), (_, _, b) = results.values()
        print(f"speed-up: {b / a:.1f}x")


if __name__ == "__main__":
    main()
