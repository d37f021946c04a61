#!/usr/bin/env bash
# scripts/spark.sh: what a real Spark (local mode, from the pyspark package)
# needs to read the Iceberg table `rllm-pipe iceberg sync` keeps
# (train/python/tests/test_iceberg_spark.py): Iceberg's Spark runtime and the
# JDBC drivers of the SQL catalogs, fetched once with Maven from the pinned
# scripts/iceberg/pom.xml into a cached flat folder keyed by that pom.
#
# Spark itself is the pyspark pinned in train/python/requirements-test.txt:
# it lives in the tests' virtualenv, which scripts/pytest.sh builds (once,
# cached); --prepare checks it is pinned there on the runtime's Spark minor
# version (pyspark 4.3 with the 4.1 runtime fails on the first query).
#
#   scripts/spark.sh --prepare   fetch the jars (once; ~60 MB), check java
#                                and the pyspark pin
#   scripts/spark.sh --jars      print the jar folder; exit 1 (saying so)
#                                when --prepare has not made it
#
# scripts/test.sh runs --prepare while the Go side builds; scripts/pytest.sh
# passes the folder to the tests as RLLM_ICEBERG_JARS.
#
# Environment:
#   RLLM_CACHE   cache folder (default ~/.cache/rllm-pipe)
#   JAVA_HOME    the Java 17+ to use (default: java on PATH)
set -euo pipefail

REPO_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
CACHE_DIR=${RLLM_CACHE:-${HOME:?HOME is not set}/.cache/rllm-pipe}
POM=$REPO_DIR/scripts/iceberg/pom.xml
REQS=$REPO_DIR/train/python/requirements-test.txt
JARS=$CACHE_DIR/iceberg-jars-$(sha256sum <"$POM" | cut -c1-12)
JAVA=${JAVA_HOME:+$JAVA_HOME/bin/}java

die() { printf 'spark.sh: %s\n' "$*" >&2; exit 1; }

case "${1:-} $#" in
"--jars 1")
	[ -f "$JARS/.complete" ] || die "no Iceberg jars in $JARS: run scripts/spark.sh --prepare"
	echo "$JARS"
	exit 0
	;;
"--prepare 1") ;;
*) die "usage: scripts/spark.sh --prepare | --jars" ;;
esac

# Java 17+ (Spark 4 needs it; so does this pom's Maven run).
command -v "$JAVA" >/dev/null || die "java not found (Spark 4 needs Java 17+; set JAVA_HOME)"
v=$("$JAVA" -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')
major=${v%%.*}
[[ $major =~ ^[0-9]+$ ]] && ((major >= 17)) || die "Spark 4 needs Java 17+, found '$v' ($JAVA)"

# pyspark's minor version must be the runtime's (spark.binary in the pom).
binary=$(sed -n 's:.*<spark.binary>\(.*\)</spark.binary>.*:\1:p' "$POM")
pin=$(sed -n 's/^pyspark==\([0-9]*\.[0-9]*\)\..*/\1/p' "$REQS")
[ -n "$pin" ] || die "$REQS pins no pyspark==X.Y.Z"
[ "$pin" = "${binary%%_*}" ] || die "$REQS pins pyspark $pin but the pom fetches the Iceberg runtime for Spark ${binary%%_*}"

[ -f "$JARS/.complete" ] && exit 0
command -v mvn >/dev/null || die "mvn not found (needed once to fetch the Iceberg jars)"
mkdir -p "$CACHE_DIR"
# One fetch at a time: a second --prepare waits for the first, then finds
# the folder made.
if command -v flock >/dev/null; then
	exec 8>>"$CACHE_DIR/.lock-iceberg-jars"
	flock -w 1800 8 || die "timed out waiting for $CACHE_DIR/.lock-iceberg-jars"
	[ -f "$JARS/.complete" ] && exit 0
fi
echo "spark.sh: fetching the Iceberg jars with Maven into $JARS (once) ..." >&2
t0=$SECONDS
tmp=$JARS.tmp.$$
trap 'rm -rf "$tmp"' EXIT
rm -rf "$tmp"
mkdir -p "$tmp"
if ! out=$(cd "$tmp" && mvn -q -B -f "$POM" dependency:copy-dependencies -DoutputDirectory="$tmp" 2>&1); then
	printf '%s\n' "$out" | tail -n 30 >&2
	die "could not fetch the jars of $POM with Maven"
fi
ls "$tmp"/iceberg-spark-runtime-*.jar "$tmp"/sqlite-jdbc-*.jar >/dev/null 2>&1 || die "Maven did not produce the Iceberg runtime and sqlite-jdbc jars"
touch "$tmp/.complete"
rm -rf "$JARS"
mv "$tmp" "$JARS"
echo "spark.sh: Iceberg jars ready: $(du -sh "$JARS" | cut -f1) in $((SECONDS - t0))s" >&2
