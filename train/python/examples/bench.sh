#!/usr/bin/env bash
# train/python/examples/bench.sh: bench_padded.py (merged padded batches over
# Flight against the same work in Python) with the client tests' virtualenv
# and binary: scripts/pytest.sh builds both (only collecting the tests), then
# the benchmark runs. Arguments go to bench_padded.py (e.g. --rounds 5).
set -euo pipefail

REPO_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../../.." && pwd -P)
CACHE_DIR=${RLLM_CACHE:-${HOME:?HOME is not set}/.cache/rllm-pipe}
PYTHON=${PYTHON:-python3}
"$REPO_DIR/scripts/pytest.sh" --collect-only -q >/dev/null
# The virtualenv scripts/pytest.sh made (the same key).
key=$( (cat "$REPO_DIR/train/python/requirements-test.txt"; "$PYTHON" --version) | sha256sum | cut -c1-12)
PYTHONPATH="$REPO_DIR/train/python${PYTHONPATH:+:$PYTHONPATH}" exec "$CACHE_DIR/venv-$key/bin/python" "$REPO_DIR/train/python/examples/bench_padded.py" --bin "$REPO_DIR/bin/rllm-pipe" "$@"
