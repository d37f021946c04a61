#!/usr/bin/env bash
# bench-scale.sh: the scaling figures, unattended (~15-20 min on 2
# cores), each printed as median (min–max) of ROUNDS runs with the
# contenders alternating inside every run:
#   1. the manifest's commit rate with 1, 4, 16 and 64 writers: separate
#      Stores on MinIO (N ingest workers), the lanes of one Store on MinIO
#      (group commit), a local folder, and MinIO's raw PUT rate with as
#      many uploaders, side by side (commits/s, p50/p99 latency);
#   2. consumer-group acknowledgements per second with 1, 4, 16 and 64
#      members, local folder and MinIO side by side;
#   3. the 10x simulation: 64 ingest workers and 64 trainer members on
#      MinIO at the 10,000-rollout-worker plan's rates (docs/capacity.md);
#   4. Kafka ingest on a 4-partition topic: 1 and 2 workers pinned to one
#      core each, into MinIO and into local folders, with the scaling
#      efficiency and the CPU the broker and MinIO took (cmd/scalebench).
# It starts Kafka and MinIO with scripts/services.sh (never stops them).
# Raw output goes to $OUT (default a new temporary folder).
#
# Variables: ROUNDS (3), RLLM_SCALE_SECONDS (5: seconds per case of 1
# and 2; the simulation runs 6x that), GROUPS_SCALE (12000 groups of 8:
# ~1.3 GB, so that the 40-90% window is past the join), SCALE_FLAGS (more
# cmd/scalebench flags), GO (go).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
ROUNDS=${ROUNDS:-3}
GROUPS_SCALE=${GROUPS_SCALE:-12000}
SCALE_FLAGS=${SCALE_FLAGS:-}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/rllm-bench-scale.XXXXXX")}
export RLLM_SCALE_SECONDS=${RLLM_SCALE_SECONDS:-5}
mkdir -p "$OUT"

scripts/services.sh up >/dev/null
eval "$(scripts/services.sh env)"
$GO build -o bin/ ./cmd/rllm-pipe ./cmd/rllm-pipe-iceberg
$GO build -o bin/scalebench ./cmd/scalebench

echo "bench-scale: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at start; raw output in $OUT"
echo
echo "== 1. Manifest commits: N writers committing 64 KiB shards at once for ${RLLM_SCALE_SECONDS}s each;"
echo "   s3: N Stores (N ingest workers) racing for the next manifest number on MinIO; s3-lanes: N goroutines on one Store"
echo "   (a worker's lanes: their appends share records); local: N goroutines on the one Store (a local root has one"
echo "   writer); raw: MinIO's own rate of 64 KiB create-only PUTs with N uploaders, the bound. Median (min–max) of $ROUNDS runs."
$GO test -run '^$' -bench 'IntegrationManifestCommits' -benchtime 1x -count "$ROUNDS" -timeout 30m ./connectors/s3/ >"$OUT/manifest.txt" 2>&1 ||
	{ cat "$OUT/manifest.txt"; exit 1; }
bin/scalebench --summarize <"$OUT/manifest.txt"
echo
echo "== 2. Consumer-group acknowledgements: N members (a reader each) consuming one-group batches over 300 shards of 20 groups"
echo "   for ${RLLM_SCALE_SECONDS}s each, acknowledging each batch at once; a new group per run. Median (min–max) of $ROUNDS runs."
$GO test -run '^$' -bench 'IntegrationGroupAcks' -benchtime 1x -count "$ROUNDS" -timeout 30m ./connectors/s3/ >"$OUT/acks.txt" 2>&1 ||
	{ cat "$OUT/acks.txt"; exit 1; }
bin/scalebench --summarize <"$OUT/acks.txt"
echo
echo "== 3. The 10x simulation: 64 ingest workers committing 26 shards/s in all and 64 members acknowledging 110 batches/s,"
echo "   at once, on MinIO (docs/capacity.md). Median (min–max) of $ROUNDS runs."
RLLM_SCALE_SECONDS=$RLLM_SCALE_SECONDS $GO test -run '^$' -bench 'IntegrationTenX' -benchtime 1x -count "$ROUNDS" -timeout 60m ./connectors/s3/ >"$OUT/tenx.txt" 2>&1 ||
	{ cat "$OUT/tenx.txt"; exit 1; }
bin/scalebench --summarize <"$OUT/tenx.txt"
echo
echo "== 4. Ingest workers"
# shellcheck disable=SC2086
bin/scalebench --bin bin/rllm-pipe --groups "$GROUPS_SCALE" --rounds "$ROUNDS" --work "$OUT/work" $SCALE_FLAGS 2>"$OUT/ingest-stderr.txt" | tee "$OUT/ingest.txt"
rm -rf "$OUT/work"
echo
echo "bench-scale: load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
