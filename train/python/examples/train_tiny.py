"""Train a tiny model for a few steps from a gateway-free generated run.

    pip install ./train/python    # or PYTHONPATH=train/python
    python train/python/examples/train_tiny.py [--steps 6] [--bin PATH]

It generates multi-turn traces with context resets over 12 policy versions
(`rllm-pipe gen`; batches of a few groups, so the trainer, one version per
step, runs ahead of the data and its staleness reaches the bound), ingests
them into shards with GRPO advantages (`rllm-pipe ingest`), serves them with
`rllm-pipe serve --layout trajectories` on loopback, and trains a unigram
policy (one logit per token id, numpy only) with a policy-gradient loss on
the padded batches: loss = -sum(advantages * log p(token)) over action
tokens (response_mask). Each batch is acknowledged after its optimizer step,
with the policy version that step made (the dataset advances it by one per
step), so `serve --max-staleness 2` bounds the staleness of every batch as
trained on; that staleness (the trainer's version minus the rows') is
printed.

The binary: --bin, else $RLLM_PIPE_BIN, else bin/rllm-pipe of the repository,
else rllm-pipe on PATH. Only pyarrow and numpy are needed.
"""

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from rllm_pipe.dataset import PaddedBatches

HERE = pathlib.Path(__file__).resolve()

VOCAB = 512
PAD = VOCAB  # outside the vocabulary: attention covers every real token


def find_bin(arg):
    for cand in (arg, os.environ.get("RLLM_PIPE_BIN"), str(HERE.parents[3] / "bin" / "rllm-pipe"), shutil.which("rllm-pipe")):
        if cand and os.path.exists(cand):
            return cand
    sys.exit("rllm-pipe binary not found: build it (go build -o bin/rllm-pipe ./cmd/rllm-pipe) or pass --bin")


def serve(bin_, out, work, max_staleness):
    ready = work / "ready"
    proc = subprocess.Popen(
        [bin_, "serve", "--from", str(out), "--listen", "127.0.0.1:0", "--ready-file", str(ready), "--follow=false",
         "--layout", "trajectories", "--max-tokens", "4000", "--max-staleness", str(max_staleness), "--max-inflight", "1", "--poll", "50ms"],
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 30
    while not (ready.exists() and ready.read_text().strip()):
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            sys.exit("serve did not start")
        time.sleep(0.05)
    return proc, "grpc://" + ready.read_text().strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--bin")
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--max-staleness", type=int, default=2, help="serve --max-staleness: the bound every batch's staleness stays within")
    args = ap.parse_args()
    bin_ = find_bin(args.bin)
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        run = lambda *a: subprocess.run([bin_, *a], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        run("gen", "--groups", "96", "--group-size", "4", "--turns", "2..6", "--resets", "0.1", "--observation-len", "32",
            "--prompt-len", "64", "--response-len", "32", "--vocab", str(VOCAB), "--policy-versions", "12", "--to", str(work / "t.jsonl"))
        run("ingest", "--from", str(work / "t.jsonl"), "--to", str(work / "out"), "--group-size", "4", "--quiet")
        proc, location = serve(bin_, work / "out", work, args.max_staleness)
        try:
            logits = np.zeros(VOCAB + 1)  # the policy: a unigram model
            data = PaddedBatches(location, "tiny-trainer", pad_token_id=PAD, max_prompt_length=1024,
                                 max_response_length=1024, pad_rows_to_multiple=4, policy_version=1, max_batches=args.steps)
            for step in data:
                with step:  # acknowledged once the optimizer step below is done
                    p = step.padded
                    tokens, adv, mask = p.responses, p.advantages, p.response_mask
                    logp = logits - np.log(np.exp(logits).sum())
                    loss = -(adv * logp[tokens] * mask).sum() / max(mask.sum(), 1)
                    # d loss / d logits: per action token, -adv * (onehot - softmax)
                    w = (adv * mask).ravel()
                    grad = -np.bincount(tokens.ravel(), weights=w, minlength=VOCAB + 1) + w.sum() * np.exp(logp)
                    logits -= args.lr * grad / max(mask.sum(), 1)  # the optimizer step
                    st = step.staleness
                    tr = p.truncation
                print(f"step {data.stats['batches']}: batch {step.batch_id} groups={len(step.batch.groups)} rows={tr['rows']}+{tr['pad_rows']} pad "
                      f"actions={int(mask.sum())} policy_version={step.policy_version} staleness max={st['max']} mean={st['mean']:.2f} "
                      f"loss={loss:+.4f} ack={step.ack_result} acked_version={data.policy_version}")
            print(f"done: {data.stats}")
        finally:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
