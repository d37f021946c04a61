#!/usr/bin/env bash
# scripts/verl-test.sh: rllm-pipe batches into the real verl (train/python/
# tests/test_verl.py). Makes (once, cached) a virtualenv with the pinned
# packages of train/python/requirements-verl.txt and verl==$VERL_VERSION
# without its dependencies, then runs the tests. `--prepare` alone only makes
# the virtualenv; `--python` alone makes it and prints its interpreter.
#
# Environment:
#   RLLM_CACHE   cache folder (default ~/.cache/rllm-pipe)
#   PYTHON       interpreter to build it from (default python3; 3.10-3.12)
#   RLLM_SKIP_VERL=1  skip (say so) instead of building ~5.5 GB
set -euo pipefail

REPO_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
CACHE_DIR=${RLLM_CACHE:-${HOME:?HOME is not set}/.cache/rllm-pipe}
PYTHON=${PYTHON:-python3}
REQS=$REPO_DIR/train/python/requirements-verl.txt
VERL_VERSION=0.9.1

if [ "${RLLM_SKIP_VERL:-}" = 1 ]; then
	echo "verl-test.sh: RLLM_SKIP_VERL=1: the verl tests are skipped" >&2
	exit 0
fi
"$PYTHON" -c 'import sys; sys.exit(not ((3, 10) <= sys.version_info[:2] <= (3, 12)))' ||
	{ echo "verl-test.sh: verl $VERL_VERSION needs Python 3.10-3.12, $PYTHON is $("$PYTHON" --version 2>&1) (set PYTHON)" >&2; exit 1; }
key=$( (cat "$REQS"; echo "verl==$VERL_VERSION"; "$PYTHON" --version) | sha256sum | cut -c1-12)
VENV=$CACHE_DIR/venv-verl-$key
. "$REPO_DIR/scripts/lib/venv.sh"
[ -f "$VENV/.complete" ] || echo "verl-test.sh: about 2.6 GB to download, once" >&2
build_venv verl-test.sh "$VENV" "$PYTHON" "$REQS" --no-deps "verl==$VERL_VERSION"

[ "${1:-}" = --prepare ] && [ $# = 1 ] && exit 0
if [ "${1:-}" = --python ] && [ $# = 1 ]; then
	echo "$VENV/bin/python"
	exit 0
fi

cd "$REPO_DIR"
[ -x bin/rllm-pipe ] || go build -o bin/rllm-pipe ./cmd/rllm-pipe
cd train/python
RLLM_PIPE_BIN=$REPO_DIR/bin/rllm-pipe PYTHONPATH=$PWD exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/test_verl.py "$@"
