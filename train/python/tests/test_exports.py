"""SFT exports load with Hugging Face datasets in the shapes TRL expects."""

import collections
import json
import subprocess

import pyarrow.parquet as pq
import pytest

datasets = pytest.importorskip("datasets")

from conftest import BIN


def trajectories(out):
    """trajectory_id -> (task_id, reward), read with pyarrow from the shards the
    manifest lists."""
    with open(out / "_manifest" / "shards.jsonl") as f:
        paths = [e["path"] for e in map(json.loads, f) if e.get("path")]
    trajs = {}
    for p in paths:
        t = pq.read_table(out / p, columns=["task_id", "trajectory_id", "reward"]).to_pylist()
        for r in t:
            trajs[r["trajectory_id"]] = (r["task_id"], r["reward"])
    return trajs


def export(out, dest, *flags):
    subprocess.run([BIN, "export", "sft", "--from", str(out), "--to", str(dest), "--quiet", *flags], check=True)
    kind = "parquet" if str(dest).endswith(".parquet") else "json"
    return datasets.load_dataset(kind, data_files=str(dest), split="train")


def check_message(m):
    assert m["role"] in {"system", "user", "assistant", "tool"}, m
    assert "content" in m


@pytest.mark.parametrize("ext", ["jsonl", "parquet"])
def test_messages_format(shards, tmp_path, ext):
    ds = export(shards, tmp_path / f"sft.{ext}", "--with-ids")
    assert {"messages", "tools"} <= set(ds.column_names)
    assert len(ds) == len(trajectories(shards))  # one conversation per trajectory here
    for row in ds:
        msgs = row["messages"]
        assert len(msgs) >= 2
        for m in msgs:
            check_message(m)
        assert msgs[-1]["role"] == "assistant"
        called = any(m.get("tool_calls") for m in msgs)
        if called:
            names = {t["function"]["name"] for t in row["tools"]}
            used = {c["function"]["name"] for m in msgs for c in (m.get("tool_calls") or [])}
            assert used <= names, (used, names)
        else:
            assert row["tools"] is None


@pytest.mark.parametrize("ext", ["jsonl", "parquet"])
def test_prompt_completion_best_of_n(shards, tmp_path, ext):
    trajs = trajectories(shards)
    by_task = collections.defaultdict(list)
    for tid, (task, reward) in trajs.items():
        if reward >= 0.5:
            by_task[task].append((-reward, tid))
    want = {tid for rows in by_task.values() for _, tid in sorted(rows)[:2]}

    ds = export(shards, tmp_path / f"pc.{ext}", "--format", "prompt-completion", "--best-of-n", "2", "--min-reward", "0.5", "--with-ids")
    assert {"prompt", "completion"} <= set(ds.column_names)
    assert "messages" not in ds.column_names
    assert set(ds["trajectory_id"]) == want and len(ds) == len(want)
    for row in ds:
        assert row["completion"] and all(m["role"] == "assistant" for m in row["completion"])
        assert row["prompt"][-1]["role"] != "assistant"
        for m in row["prompt"] + row["completion"]:
            check_message(m)
