"""The Iceberg projection read by a real Spark (local mode, pyspark from
PyPI) through Iceberg's JDBC catalog on the SQLite file `rllm-pipe
iceberg sync` keeps: per-version totals, time travel to the snapshot that
first held a version, and whole prompts rebuilt from the stored deltas in
Spark SQL (rllm_pipe.iceberg.SPARK_WHOLE_PROMPTS_SQL) all agree with
`rllm-pipe sql`.

Needs java 17+ and the jars of scripts/spark.sh --prepare (scripts/test.sh
fetches them; scripts/pytest.sh passes their folder as RLLM_ICEBERG_JARS):
skips, saying why, when either is missing."""

import json
import math
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from conftest import BIN, REPO

pytest.importorskip("pyspark")
# Spark's start-up and first query cost ~20 s: the longer tier (make
# test-long, which CI runs after make test) runs these.
if os.environ.get("RLLM_TEST_LONG") != "1":
    pytest.skip("Spark's tests run in make test-long (RLLM_TEST_LONG=1)", allow_module_level=True)
from pyspark.sql import SparkSession  # noqa: E402

from rllm_pipe.iceberg import SPARK_WHOLE_PROMPTS_SQL  # noqa: E402

TABLE = "rllm.rllm.steps"  # Spark catalog rllm, namespace rllm, table steps

LOG4J2 = """\
status = error
rootLogger.level = error
rootLogger.appenderRef.err.ref = err
# The level of the shell pyspark runs: the same, so Spark says nothing of it.
logger.repl.name = org.apache.spark.api.python.PythonGatewayServer
logger.repl.level = error
appender.err.type = Console
appender.err.name = err
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = spark %p %c{1}: %m%n
"""


def run(*args):
    return subprocess.run([BIN, *args], check=True, capture_output=True, text=True)


def sql(root, query):
    out = run("sql", "--from", str(root), "--format", "jsonl", query).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def iceberg_jars():
    """The jar folder: RLLM_ICEBERG_JARS (must hold the jars when set), else
    what scripts/spark.sh --jars says, else skip."""
    d = os.environ.get("RLLM_ICEBERG_JARS")
    if not d:
        r = subprocess.run([str(REPO / "scripts" / "spark.sh"), "--jars"], capture_output=True, text=True)
        if r.returncode:
            pytest.skip(f"no Iceberg jars for Spark ({r.stderr.strip()})")
        d = r.stdout.strip()
    jars = sorted(pathlib.Path(d).glob("*.jar"))
    names = " ".join(j.name for j in jars)
    assert "iceberg-spark-runtime-" in names and "sqlite-jdbc-" in names, f"{d} lacks the Iceberg runtime or sqlite-jdbc jar: {names!r}"
    return jars


def java():
    j = pathlib.Path(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else shutil.which("java")
    if not j or not os.access(j, os.X_OK):
        pytest.skip("no java for Spark (Java 17+ on PATH or JAVA_HOME)")


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    """A root of multi-turn trajectories (prompts stored as deltas) over
    five versions, in three ingest runs synced after each (several
    commits each), the last run writing shards of several versions and
    the only one with version 4. Returns (root, catalog file)."""
    d = tmp_path_factory.mktemp("spark-lake")
    root, catalog = d / "data", d / "lake" / "catalog.db"
    src = d / "t.jsonl"
    run("gen", "--groups", "90", "--group-size", "3", "--turns", "1..4", "--resets", "0.2", "--token-versions", "--teacher",
        "--policy-versions", "5", "--seed", "10", "--to", str(src))
    # By task, and every task that reaches version 4 in the last run: the
    # table holds that version only from a later snapshot on.
    lines = src.read_text().splitlines()
    late = {r["task_id"] for r in map(json.loads, lines) if r.get("policy_version") == 4}
    parts = [[], [], []]
    for line in lines:
        r = json.loads(line)
        parts[2 if r["task_id"] in late else int(r["task_id"].rsplit("-", 1)[1]) % 3].append(line)
    for i, extra in enumerate(([], [], ["--max-partitions", "1"])):
        part = d / f"t{i}.jsonl"
        part.write_text("\n".join(parts[i]) + "\n")
        run("ingest", "--from", str(part), "--to", str(root), "--group-size", "3", "--shard-size", "64KiB", "--quiet", *extra)
        run("iceberg", "sync", "--from", str(root), "--catalog", str(catalog), "--max-files-per-commit", "4")
    return root, catalog


@pytest.fixture(scope="module")
def jars():
    """The jars, checked with java before any lake is built."""
    java()
    return iceberg_jars()


@pytest.fixture(scope="module")
def spark(jars, lake, tmp_path_factory):
    """A local[1] SparkSession with Iceberg's SQL extensions and a JDBC
    catalog named rllm on the lake's SQLite file; quiet, loopback only,
    its scratch files under pytest's tmp dir."""
    root, catalog = lake
    tmp = tmp_path_factory.mktemp("spark")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARK_LOCAL_IP", "127.0.0.1")
        env.setenv("PYSPARK_PYTHON", sys.executable)
        session = start_spark(jars, catalog, root / "_iceberg", tmp)
        yield session
        session.stop()


def start_spark(jars, catalog, warehouse, tmp):
    log4j = tmp / "log4j2.properties"
    log4j.write_text(LOG4J2)
    session = (
        SparkSession.builder.master("local[1]")
        .appName("rllm-pipe-iceberg-test")
        .config("spark.jars", ",".join(str(j) for j in jars))
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config("spark.sql.catalog.rllm", "org.apache.iceberg.spark.SparkCatalog")
        .config("spark.sql.catalog.rllm.type", "jdbc")
        .config("spark.sql.catalog.rllm.uri", f"jdbc:sqlite:{catalog}")
        .config("spark.sql.catalog.rllm.jdbc.schema-version", "V1")
        .config("spark.sql.catalog.rllm.warehouse", str(warehouse))
        .config("spark.sql.catalogImplementation", "in-memory")
        .config("spark.sql.warehouse.dir", str(tmp / "warehouse"))
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.local.dir", str(tmp / "local"))
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={log4j.as_uri()} -Djava.io.tmpdir={tmp}")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def rows(spark, query):
    return [r.asDict() for r in spark.sql(query).collect()]


def test_spark_totals_per_version_match_sql(spark, lake):
    root, _ = lake
    totals = "SELECT group_version, count(*) AS n, sum({len}(response_ids)) AS toks, sum(reward) AS r FROM {table} GROUP BY group_version ORDER BY group_version"
    got = rows(spark, totals.format(len="size", table=TABLE))
    want = sql(root, totals.format(len="len", table="steps"))
    assert [g["group_version"] for g in got] == [w["group_version"] for w in want] == list(range(5))
    for g, w in zip(got, want):
        assert (g["n"], g["toks"]) == (w["n"], w["toks"]), (g, w)
        assert math.isclose(g["r"], w["r"], rel_tol=1e-9, abs_tol=1e-9), (g, w)


def test_spark_time_travel_to_the_snapshot_that_first_held_a_version(spark, lake):
    root, _ = lake
    # Each snapshot covers the first rllm-pipe.shards shards of the manifest.
    snaps = rows(spark, f"SELECT snapshot_id, summary FROM {TABLE}.snapshots")
    snaps.sort(key=lambda s: int(s["summary"]["rllm-pipe.shards"]))
    assert len(snaps) >= 3
    with open(root / "_manifest" / "shards.jsonl") as f:
        shards = [json.loads(line) for line in f]
    shards = [s for s in shards if s.get("path")]

    def count(snap, where=""):
        return spark.sql(f"SELECT count(*) AS n FROM {TABLE} VERSION AS OF {snap['snapshot_id']} {where}").collect()[0]["n"]

    i = next(i for i, s in enumerate(snaps) if count(s, "WHERE group_version = 4"))
    first = snaps[i]
    n = int(first["summary"]["rllm-pipe.shards"])
    assert first["summary"]["rllm-pipe.last-shard"] == shards[n - 1]["path"]
    assert count(first) == sum(s["rows"] for s in shards[:n]) > 0
    assert i > 0, "version 4 must arrive after the first snapshot"
    before = snaps[i - 1]
    assert int(before["summary"]["rllm-pipe.shards"]) < n
    assert count(before, "WHERE group_version = 4") == 0


def test_spark_sql_rebuilds_whole_prompts(spark, lake):
    root, _ = lake
    key = "group_id, group_version, trajectory_id, step_index"
    got = rows(spark, f"SELECT * FROM ({SPARK_WHOLE_PROMPTS_SQL.format(table=TABLE)}) ORDER BY {key}")
    want = sql(root, f"SELECT {key}, prompt_ids, prompt_prefix_len FROM steps ORDER BY {key}")
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        k = tuple(w[c] for c in ("group_id", "group_version", "trajectory_id", "step_index"))
        assert tuple(g[c] for c in ("group_id", "group_version", "trajectory_id", "step_index")) == k
        assert g["prompt_ids"] == w["prompt_ids"], k
    stored = spark.sql(f"SELECT count(*) AS n FROM {TABLE} WHERE prompt_prefix_len > 0 AND prompt_ids IS NULL").collect()[0]["n"]
    assert stored == sum(bool(w["prompt_prefix_len"]) for w in want) > 0, "the table must hold prompts stored as deltas"
