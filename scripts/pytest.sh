#!/usr/bin/env bash
# scripts/pytest.sh: the Python client's tests (train/python) against a real
# `rllm-pipe serve`. Builds the binary, makes (once, cached) a virtualenv with
# the pinned packages of train/python/requirements-test.txt from PyPI, and
# runs pytest. Extra arguments go to pytest; `--prepare` alone only makes
# the virtualenv (scripts/test.sh does that while the Go side builds);
# `--python` alone makes it and prints its interpreter's path (make loop).
#
# Environment:
#   RLLM_CACHE   cache folder for the virtualenv (default ~/.cache/rllm-pipe)
#   PYTHON       interpreter to build it from (default python3; 3.10 or newer:
#                the openai SDK and rllm-model-gateway need it)
set -euo pipefail

REPO_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
CACHE_DIR=${RLLM_CACHE:-${HOME:?HOME is not set}/.cache/rllm-pipe}
PYTHON=${PYTHON:-python3}
REQS=$REPO_DIR/train/python/requirements-test.txt

command -v "$PYTHON" >/dev/null || { echo "pytest.sh: $PYTHON not found (Python 3.10+ is needed for the client tests)" >&2; exit 1; }
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
	{ echo "pytest.sh: $("$PYTHON" --version 2>&1) is too old: the client tests need Python 3.10+ (set PYTHON)" >&2; exit 1; }
key=$( (cat "$REQS"; "$PYTHON" --version) | sha256sum | cut -c1-12)
VENV=$CACHE_DIR/venv-$key
. "$REPO_DIR/scripts/lib/venv.sh"
build_venv pytest.sh "$VENV" "$PYTHON" "$REQS"

[ "${1:-}" = --prepare ] && [ $# = 1 ] && exit 0
if [ "${1:-}" = --python ] && [ $# = 1 ]; then
	echo "$VENV/bin/python"
	exit 0
fi

cd "$REPO_DIR"
go build -o bin/ ./cmd/rllm-pipe ./cmd/rllm-pipe-iceberg
cd train/python
# The Spark test's jars, when scripts/spark.sh --prepare has fetched them.
if [ -z "${RLLM_ICEBERG_JARS:-}" ] && jars=$("$REPO_DIR/scripts/spark.sh" --jars 2>/dev/null); then export RLLM_ICEBERG_JARS=$jars; fi
RLLM_PIPE_BIN=$REPO_DIR/bin/rllm-pipe PYTHONPATH=$PWD exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
