"""The Iceberg projection read by a real outside reader: `rllm-pipe iceberg
sync` adds a root's shards to a table in a SQL catalog on SQLite;
pyiceberg (PyPI) scans it and gets exactly what `rllm-pipe sql` gives —
every column of every row, whole prompts included — and time-travels to
the snapshot that first held a policy version."""

import datetime
import json
import math
import subprocess

import pytest

from conftest import BIN

pyiceberg = pytest.importorskip("pyiceberg")
from pyiceberg.catalog.sql import SqlCatalog  # noqa: E402

from rllm_pipe.iceberg import read_steps  # noqa: E402


def run(*args):
    return subprocess.run([BIN, *args], check=True, capture_output=True, text=True)


def sql(root, query):
    out = run("sql", "--from", str(root), "--format", "jsonl", query).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def same(a, b, where):
    """a (from pyiceberg) equals b (sql's JSON), floats to float32's
    precision as sql prints them."""
    if isinstance(a, float) or isinstance(b, float):
        assert a is not None and b is not None and math.isclose(a, b, rel_tol=2e-6, abs_tol=1e-12), where
    elif isinstance(a, datetime.datetime):
        assert a == datetime.datetime.fromisoformat(b), where
    elif isinstance(a, list) and a and isinstance(a[0], tuple):  # a map
        assert dict(a) == pytest.approx(b, rel=2e-6), where
    elif isinstance(a, list):
        assert b is not None and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    """A root of multi-turn trajectories (prompts stored as deltas, token
    versions, teacher logprobs) over five versions, in three ingest runs
    synced after each, the last run writing shards of several versions."""
    d = tmp_path_factory.mktemp("lake")
    root, catalog = d / "data", d / "lake" / "catalog.db"
    src = d / "t.jsonl"
    run("gen", "--groups", "90", "--group-size", "3", "--turns", "1..4", "--resets", "0.2", "--token-versions", "--teacher",
        "--policy-versions", "5", "--seed", "10", "--to", str(src))
    parts = [[], [], []]
    for line in src.read_text().splitlines():
        parts[int(json.loads(line)["task_id"].rsplit("-", 1)[1]) % 3].append(line)
    for i, extra in enumerate(([], [], ["--max-partitions", "1"])):
        part = d / f"t{i}.jsonl"
        part.write_text("\n".join(parts[i]) + "\n")
        run("ingest", "--from", str(part), "--to", str(root), "--group-size", "3", "--shard-size", "64KiB", "--quiet", *extra)
        run("iceberg", "sync", "--from", str(root), "--catalog", str(catalog), "--max-files-per-commit", "4")
    return root, SqlCatalog("rllm", uri=f"sqlite:///{catalog}")


def test_pyiceberg_reads_what_sql_gives(lake):
    root, cat = lake
    table = cat.load_table("rllm.steps")
    got = read_steps(table)
    want = sql(root, "SELECT * EXCLUDE (shard) FROM steps ORDER BY group_id, group_version, trajectory_id, step_index")
    assert got.num_rows == len(want) > 0
    assert set(got.column_names) == set(want[0]), set(got.column_names) ^ set(want[0])
    rows = got.to_pylist()
    deltas = 0
    for r, w in zip(rows, want):
        key = (w["trajectory_id"], w["step_index"])
        for col, v in w.items():
            same(r[col], v, (key, col))
        deltas += bool(w["prompt_prefix_len"])
    assert deltas > 0, "the root must hold prompts stored as deltas"
    # Partition pruning by policy version: a version's scan plans only
    # its files, and reads its rows.
    for v in range(5):
        files = list(table.scan(row_filter=f"group_version = {v}").plan_files())
        assert files and all(f.file.partition[0] == v for f in files)
        n = sql(root, f"SELECT count(*) AS n FROM steps WHERE group_version = {v}")[0]["n"]
        assert read_steps(table, row_filter=f"group_version = {v}").num_rows == n


def test_a_filter_matching_nothing_gives_an_empty_table(lake):
    """pyiceberg gives an empty scan large_string columns: the rebuilt
    messages keep the scan's type (a string column failed to fit it)."""
    _, cat = lake
    got = read_steps(cat.load_table("rllm.steps"), row_filter="group_version >= 1000")
    assert got.num_rows == 0 and "messages" in got.column_names and "prompt_ids" in got.column_names


def test_trajectories_table_is_sqls_view(lake):
    """NS.trajectories holds, per trajectory, what sql's trajectories view
    folds from its steps (token counts of delta prompts, first-step
    values, policy-version range, pass), partitioned by version."""
    root, cat = lake
    table = cat.load_table("rllm.trajectories")
    key = ("group_id", "group_version", "trajectory_id")
    got = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: tuple(r[k] for k in key))
    want = sql(root, "SELECT * FROM trajectories ORDER BY group_id, group_version, trajectory_id")
    assert len(got) == len(want) > 0
    assert set(got[0]) == set(want[0]), set(got[0]) ^ set(want[0])
    for r, w in zip(got, want):
        for col, v in w.items():
            if v is None or r[col] is None:
                assert r[col] == v, (w["trajectory_id"], col)
            else:
                same(r[col], v, (w["trajectory_id"], col))
    assert len({r["prompt_tokens"] for r in got}) > 1
    for v in range(5):
        files = list(table.scan(row_filter=f"group_version = {v}").plan_files())
        assert files and all(f.file.partition[0] == v for f in files)


def test_compaction_keeps_every_row(tmp_path):
    """`iceberg compact` replaces a version's small files with merged ones
    in one snapshot: pyiceberg reads the same rows (whole prompts rebuilt
    from deltas as before), plans fewer files, keeps the position, and
    the snapshot before still reads as it did."""
    root, catalog = tmp_path / "data", tmp_path / "lake" / "catalog.db"
    src = tmp_path / "t.jsonl"
    run("gen", "--groups", "60", "--group-size", "2", "--turns", "1..4", "--policy-versions", "3", "--seed", "5", "--to", str(src))
    parts = [[] for _ in range(6)]
    for line in src.read_text().splitlines():
        parts[int(json.loads(line)["task_id"].rsplit("-", 1)[1]) % 6].append(line)
    for i, lines in enumerate(parts):  # a shard per version and run
        part = tmp_path / f"p{i}.jsonl"
        part.write_text("\n".join(lines) + "\n")
        run("ingest", "--from", str(part), "--to", str(root), "--group-size", "2", "--quiet")
    run("iceberg", "sync", "--from", str(root), "--catalog", str(catalog), "--quiet")
    cat = SqlCatalog("rllm", uri=f"sqlite:///{catalog}")
    table = cat.load_table("rllm.steps")
    old = table.current_snapshot()
    before = read_steps(table).to_pylist()
    files_before = len(list(table.scan().plan_files()))
    res = json.loads(run("iceberg", "compact", "--from", str(root), "--catalog", str(catalog), "--target-size", "1MiB", "--min-files", "2", "--json", "--quiet").stdout)
    table = cat.load_table("rllm.steps")
    files_after = len(list(table.scan().plan_files()))
    assert res["files_removed"] > files_after and files_after == files_before - res["files_removed"] + res["files_added"]
    assert files_after <= 3 * 2, files_after
    assert read_steps(table).to_pylist() == before
    snap = table.current_snapshot()
    assert snap.summary["rllm-pipe.shards"] == old.summary["rllm-pipe.shards"]
    assert read_steps(table, snapshot_id=old.snapshot_id).to_pylist() == before
    for f in table.scan().plan_files():
        assert "/_iceberg/" in f.file.file_path  # merged files live with the table, the shards stay
    # A later sync adds only new shards; sql and the table still agree.
    run("iceberg", "sync", "--from", str(root), "--catalog", str(catalog), "--quiet")
    assert read_steps(cat.load_table("rllm.steps")).num_rows == sql(root, "SELECT count(*) AS n FROM steps")[0]["n"]


def test_time_travel_to_the_snapshot_that_first_held_a_version(lake):
    root, cat = lake
    table = cat.load_table("rllm.steps")
    snaps = sorted(table.snapshots(), key=lambda s: s.sequence_number)
    assert len(snaps) >= 3
    # Each snapshot holds the first rllm-pipe.shards shards of the manifest.
    with open(root / "_manifest" / "shards.jsonl") as f:
        shards = [json.loads(line) for line in f]
    shards = [s for s in shards if s.get("path")]
    for s in snaps:
        n = int(s.summary["rllm-pipe.shards"])
        assert s.summary["rllm-pipe.last-shard"] == shards[n - 1]["path"]
        rows = table.scan(snapshot_id=s.snapshot_id).to_arrow().num_rows
        assert rows == sum(x["rows"] for x in shards[:n])
    # The first snapshot holding a row of version 4.
    first = next(s for s in snaps if table.scan(snapshot_id=s.snapshot_id, row_filter="group_version = 4").to_arrow().num_rows)
    before = [s for s in snaps if s.sequence_number < first.sequence_number]
    assert all(table.scan(snapshot_id=s.snapshot_id, row_filter="group_version = 4").to_arrow().num_rows == 0 for s in before)


def test_snapshot_isolation_while_ingest_runs(tmp_path):
    """A reader scanning the table while ingest keeps committing and a
    --follow syncer keeps adding: every snapshot it reads holds exactly
    the rows of the manifest's first rllm-pipe.shards shards, never part
    of a commit."""
    import threading
    import time

    root, catalog = tmp_path / "data", tmp_path / "lake" / "catalog.db"
    src = tmp_path / "t.jsonl"
    run("gen", "--groups", "120", "--group-size", "2", "--turns", "1..3", "--policy-versions", "4", "--seed", "3", "--to", str(src))
    lines = src.read_text().splitlines()
    parts = [[], [], [], []]
    for line in lines:
        parts[int(json.loads(line)["task_id"].rsplit("-", 1)[1]) % 4].append(line)
    first = tmp_path / "p0.jsonl"
    first.write_text("\n".join(parts.pop(0)) + "\n")
    run("ingest", "--from", str(first), "--to", str(root), "--group-size", "2", "--quiet")
    follow = subprocess.Popen([BIN, "iceberg", "sync", "--from", str(root), "--catalog", str(catalog), "--follow", "--poll", "30ms", "--max-files-per-commit", "2", "--quiet"],
                              stderr=subprocess.PIPE)
    seen, errors, stop = {}, [], threading.Event()

    def manifest_rows():
        with open(root / "_manifest" / "shards.jsonl") as f:
            return [e["rows"] for e in map(json.loads, f) if e.get("path")]

    def reader():
        cat = None
        while not stop.is_set():
            try:
                if cat is None:
                    cat = SqlCatalog("rllm", uri=f"sqlite:///{catalog}")
                table = cat.load_table("rllm.steps")
            except Exception:  # not made yet
                time.sleep(0.02)
                continue
            snap = table.current_snapshot()
            if snap is None:
                continue
            n = int(snap.summary["rllm-pipe.shards"])
            rows = table.scan(snapshot_id=snap.snapshot_id).to_arrow().num_rows
            want = sum(manifest_rows()[:n])
            if rows != want:
                errors.append((snap.snapshot_id, n, rows, want))
            seen[snap.snapshot_id] = n

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        for i, part in enumerate(parts):
            p = tmp_path / f"p{i + 1}.jsonl"
            p.write_text("\n".join(part) + "\n")
            run("ingest", "--from", str(p), "--to", str(root), "--group-size", "2", "--quiet")
            time.sleep(1.0)
        deadline = time.time() + 30
        while time.time() < deadline and (not seen or max(seen.values()) < len(manifest_rows())):
            time.sleep(0.05)
    finally:
        stop.set()
        t.join(30)
        follow.terminate()
        follow.wait(30)
    assert follow.returncode in (0, -15), follow.stderr.read().decode()
    assert not errors, errors
    assert seen and max(seen.values()) == len(manifest_rows())
    assert len(seen) >= 3, f"the reader saw {len(seen)} snapshots: the test needs it to read while the table grows"
