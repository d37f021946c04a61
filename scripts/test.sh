#!/usr/bin/env bash
# scripts/test.sh: `make test`, the whole suite. The installs a fresh
# machine needs first are mostly waiting on the network (Debian's chromium,
# the Python packages) or mostly CPU (building MinIO, compiling the tests):
# the first two run in the background while the CPU vets the tree and
# brings the services up, so a fresh machine pays for the longest of them,
# not their sum. Then the Go tests, race detector on, against the real
# Kafka and MinIO (the TestIntegration* tier reads RLLM_PIPE_KAFKA_BROKERS and
# RLLM_PIPE_S3_ENDPOINT), and last the Python client's tests.
#
# Environment: GO (default go); those of scripts/services.sh,
# scripts/browser.sh and scripts/pytest.sh.
set -euo pipefail

cd "$(dirname -- "${BASH_SOURCE[0]}")/.."
GO=${GO:-go}
# A binary built with -race sleeps 1 s before it exits (GORACE's
# atexit_sleep_ms): every test binary, and every rllm-pipe the tests launch.
export GORACE=${GORACE:-atexit_sleep_ms=0}
logs=$(mktemp -d "${TMPDIR:-/tmp}/rllm-test.XXXXXX")

# A failing step ends the run only once the background installs have
# ended by themselves (an apt-get or pip cut short leaves a broken
# install behind for the next run).
trap 'wait; rm -rf "$logs"' EXIT

scripts/browser.sh >/dev/null 2>"$logs/browser" &
browser=$!
scripts/pytest.sh --prepare >"$logs/venv" 2>&1 &
venv=$!
scripts/spark.sh --prepare >"$logs/spark" 2>&1 &
spark=$!
# verl's environment is ~2.6 GB to download on a fresh machine: fetched
# while the Go tests run.
scripts/verl-test.sh --prepare >"$logs/verl" 2>&1 &
verl=$!

"$GO" vet ./...
GO="$GO" scripts/layers.sh
scripts/services.sh up >/dev/null

if ! wait "$browser"; then
	cat "$logs/browser" >&2
	echo "make test: NO CHROMIUM: the browser tests of report and ui will skip" >&2
fi
(eval "$(scripts/services.sh env)" && "$GO" test -race -count=1 -timeout 60m ./...)

if ! wait "$venv"; then
	cat "$logs/venv" >&2
	echo "make test: the Python tests' virtualenv could not be built (above)" >&2
	exit 1
fi
if ! wait "$spark"; then
	cat "$logs/spark" >&2
	echo "make test: the Iceberg jars for Spark could not be fetched (above)" >&2
	exit 1
fi
scripts/pytest.sh
if ! wait "$verl"; then
	cat "$logs/verl" >&2
	echo "make test: verl's test environment could not be built (above)" >&2
	exit 1
fi
scripts/verl-test.sh
