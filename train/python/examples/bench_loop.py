"""make bench-loop: the closed loop's numbers, on this machine.

Runs examples/loop.py (policy server, openai-SDK agents through the
gateway, serve, a GRPO trainer) for --duration seconds per configuration,
the configurations alternated round by round, --rounds times, and prints
the median and the spread (min-max) of:

* trainer data stall (share of the trainer's time waiting for a batch,
  after its first) with rollout supply at 0.5x, 1x and 2x its demand; the
  trainer's demand is set by a simulated compute of --seconds-per-group
  per group trained, the supply by the agents' group rate;
* freshness p50/p99 (finished at the gateway -> delivered) at flush 1 s
  and 200 ms, supply 1x, and what the short flush costs (shards committed
  a minute: `ingest --compact` merges them);
* groups discarded as stale (serve --max-staleness 1) at supply 2x, with
  and without the gateway's pacing.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

LOOP = pathlib.Path(__file__).resolve().parent / "loop.py"


def configs(demand: float) -> dict[str, list[str]]:
    rate = lambda x: ["--group-rate", str(x * demand)]  # noqa: E731
    return {
        "supply 0.5x": rate(0.5),
        "supply 1x": rate(1),
        "supply 2x": rate(2),
        "flush 1s, supply 1x": [*rate(1), "--flush-interval", "1s"],
        "stale, pacing on": [*rate(2), "--serve-max-staleness", "1"],
        "stale, pacing off": [*rate(2), "--serve-max-staleness", "1", "--no-pacing"],
    }


def run(args, name: str, flags: list[str], n: int) -> dict:
    work = pathlib.Path(args.work) / f"{name.replace(' ', '_').replace(',', '')}-{n}"
    cmd = [sys.executable, str(LOOP), "--bin", args.bin, "--work", str(work), "--duration", str(args.duration),
           "--seconds-per-group", str(args.seconds_per_group), *flags]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    summary = json.loads((work / "summary.json").read_text())
    # What a short flush costs: shards (files) committed a minute.
    summary["shards_per_min"] = len(list((work / "data").glob("policy=*/*.parquet"))) * 60 / summary["wall_s"]
    return summary


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3g} ({min(xs):.3g}-{max(xs):.3g})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="bin/rllm-pipe")
    ap.add_argument("--work", default=".run/bench-loop")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=30)
    ap.add_argument("--seconds-per-group", type=float, default=0.5, help="the trainer's demand is 1/this groups a second")
    ap.add_argument("--only", help="run only the configurations whose name contains this")
    args = ap.parse_args()
    demand = 1 / args.seconds_per_group
    cfgs = {k: v for k, v in configs(demand).items() if not args.only or args.only in k}
    results: dict[str, list[dict]] = {k: [] for k in cfgs}
    for r in range(args.rounds):
        for name, flags in cfgs.items():  # alternated: every round runs each once
            t0 = time.monotonic()
            results[name].append(run(args, name, flags, r))
            print(f"round {r + 1}/{args.rounds}: {name} ({time.monotonic() - t0:.0f}s)", file=sys.stderr, flush=True)
    print(f"trainer demand {demand:g} groups/s; {args.duration:g} s a run; median (min-max) of {args.rounds}")
    print(f"{'configuration':24} {'stall (steady)':>20} {'freshness p50 ms':>22} {'freshness p99 ms':>22} {'staleness max':>16} {'skipped stale':>16} {'held by pacing':>16} {'shards/min':>16}")
    for name, rs in results.items():
        col = lambda f: med([float(f(x)) for x in rs])  # noqa: E731
        print(f"{name:24} {col(lambda x: x['stall_steady']):>20} {col(lambda x: x['freshness']['p50_ms']):>22} {col(lambda x: x['freshness']['p99_ms']):>22} "
              f"{col(lambda x: x['staleness_max']):>16} {col(lambda x: x.get('groups_skipped_stale', 0)):>16} "
              f"{col(lambda x: x.get('gateway', {}).get('rllm_gateway_pace_held_total', 0)):>16} {col(lambda x: x['shards_per_min']):>16}")
    out = pathlib.Path(args.work) / "results.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"runs: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
