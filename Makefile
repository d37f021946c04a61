# rllm-pipe: the two commands a fresh machine needs are `make run` and
# `make test`. `make run` needs Go and a C compiler (DuckDB links through
# cgo); `make test` also Java 17, Maven and Python 3.10+ (README: "Two
# commands"). Modules and packages are fetched on first use.
GO      ?= go
BIN     := bin/rllm-pipe
DATA    ?= data
WORK    ?= .run
GROUPS  ?= 2000
# The commit `rllm-pipe version` reports (the build info's VCS stamp is off
# where GOFLAGS has -buildvcs=false, and absent outside a checkout).
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null)$(shell git diff --quiet HEAD 2>/dev/null || echo +dirty)
LDFLAGS := -X github.com/rllm-pipe/rllm-pipe/cmd/internal/cli.commit=$(COMMIT)

.PHONY: all build run loop bench-loop test test-long test-python test-short bench fuzz lint docs fmt clean services-up services-down

all: lint test

# build: rllm-pipe and, beside it, rllm-pipe-iceberg (which `rllm-pipe
# iceberg` and ingest's --iceberg-catalog run).
build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(dir $(BIN)) ./cmd/rllm-pipe ./cmd/rllm-pipe-iceberg

# run: the main job on the embedded default (local files, no services):
# generate traces into ./.run, ingest them into ./data (the store: no other
# file goes there), print a summary.
run:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/rllm-pipe
	rm -rf $(DATA) $(WORK)
	$(BIN) gen --groups $(GROUPS) --group-size 8 --duplicates 0.01 --to $(WORK)/traces.jsonl
	$(BIN) ingest --from $(WORK)/traces.jsonl --to $(DATA) --group-size 8 --stats-json $(WORK)/ingest-stats.json
	$(BIN) summary --from $(DATA)

# loop: a model learns through the pipe on CPU (train/python/examples/loop.py):
# a toy policy server, openai-SDK agents through `rllm-pipe gateway`, `serve`,
# and a GRPO trainer that publishes each version back; stops at a mean
# reward of 0.9 (exit 1 if not within 5 minutes) and writes $(WORK)/loop/report.html.
loop: build
	PY=$$(scripts/pytest.sh --python) && PYTHONPATH=train/python $$PY train/python/examples/loop.py --bin $(BIN) --work $(WORK)/loop

# bench-loop: the closed loop's stall, freshness and stale discards, by
# supply, flush interval and pacing (train/python/examples/bench_loop.py;
# ~10 minutes), then the gateway's pacing at 500 concurrent sessions.
bench-loop: build
	PY=$$(scripts/pytest.sh --python) && PYTHONPATH=train/python $$PY train/python/examples/bench_loop.py --bin $(BIN) --work $(WORK)/bench-loop
	$(GO) test -run '^$$' -bench 'GatewayPaced' -benchtime 1x -count 3 ./ingest/gateway/

# test: the whole suite, race detector on, nothing cached (scripts/test.sh).
# It first installs (once, cached) and starts a real Kafka broker and MinIO
# server (scripts/services.sh: Java 17 and Maven fetch the broker's jars) for
# the TestIntegration* tier, which reads RLLM_PIPE_KAFKA_BROKERS / RLLM_PIPE_S3_ENDPOINT,
# while Debian's chromium (scripts/browser.sh) and the Python tests'
# virtualenv install in the background. Then the Python client's tests
# against a real `rllm-pipe serve` (scripts/pytest.sh: a cached virtualenv
# with pyarrow and pytest from PyPI), and the batches into the real verl
# (scripts/verl-test.sh: its cached environment is fetched during the Go
# tests).
test:
	GO=$(GO) scripts/test.sh

# test-long: the crash and outage scenarios at full length (10 kill -9 of
# a Kafka->MinIO ingest, a 30 s MinIO outage); `make test` runs them
# shorter. Then Spark reading the Iceberg table (its start-up alone costs
# ~20 s). CI runs both.
test-long:
	scripts/services.sh up >/dev/null
	eval "$$(scripts/services.sh env)" && RLLM_TEST_LONG=1 GORACE=atexit_sleep_ms=0 $(GO) test -race -count=1 -timeout 30m \
		-run 'TestIntegrationKafkaToS3CrashLoop|TestIntegrationOutages' ./cmd/rllm-pipe/
	scripts/spark.sh --prepare
	RLLM_TEST_LONG=1 scripts/pytest.sh -k iceberg_spark

# test-python: only the Python client's tests.
test-python:
	scripts/pytest.sh

services-up:
	scripts/services.sh up

services-down:
	scripts/services.sh down

test-short:
	$(GO) test -short -count=1 ./...

# bench: unit benchmarks (estimators, generator, decoder, merged trajectory
# rows), opening long logs (docs/performance.md#logs-and-manifests), the hand-written decoder and
# Parquet writer against libraries (cmd/ingestbench/compare, a nested module), the
# ui's paging at a million steps, merged padded batches delivered to
# Python against the same work in Python (bench_padded.py); then the service-backed ones: opening a
# long S3 manifest, the produce→commit delay at 1,000 steps/s, Kafka→MinIO
# against a bare drain and the file path (bench-kafka); last, file ingest
# side by side with DuckDB (bench-ingest) on two shapes, and issue 16's
# multi-turn comparison at 30 and 100 turns (bench-multiturn).
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./advantage/ ./ingest/ ./ingest/synth/ ./train/merge/
	$(GO) test -run '^$$' -bench Extends -count 3 ./transform/
	$(GO) test -run '^$$' -bench 'OpenGroupLog|LeaseAfterDone|ConsumerStart' -benchtime 3x -count 3 ./train/
	$(GO) test -run '^$$' -bench ReadTrajectories -benchtime 5x -count 3 ./train/
	$(GO) test -run '^$$' -bench 'GatewayLatency|SessionMemory' -benchtime 1x ./ingest/gateway/
	$(GO) test -run '^$$' -bench OpenManifest -benchtime 3x ./connectors/local/
	$(GO) test -run '^$$' -bench '^BenchmarkOpenViews$$' -benchtime 3x ./connectors/duckdb/
	$(GO) test -run '^$$' -bench Snapshot -benchtime 3x -count 3 ./connectors/store/
	cd cmd/ingestbench/compare && $(GO) test -run '^$$' -bench . -count 1
	$(GO) test -run '^$$' -bench 'UIBrowse|UIRefresh' -benchtime 1x -timeout 90m ./cmd/rllm-pipe/
	train/python/examples/bench.sh --rounds 3
	scripts/services.sh up >/dev/null
	eval "$$(scripts/services.sh env)" && $(GO) test -run '^$$' -bench OpenManifest -benchtime 3x -timeout 30m ./connectors/s3/
	eval "$$(scripts/services.sh env)" && $(GO) test -run '^$$' -bench IntegrationOpenViewsS3 -benchtime 3x -timeout 60m ./connectors/duckdb/
	eval "$$(scripts/services.sh env)" && $(GO) test -run '^$$' -bench Integration -benchtime 1x -timeout 30m ./cmd/rllm-pipe/
	$(MAKE) bench-kafka
	$(MAKE) bench-ingest
	$(MAKE) bench-ingest SHAPE=steps-nomsg
	$(MAKE) bench-multiturn

# bench-kafka: Kafka→MinIO ingest next to a bare kafka-go drain and the
# file→directory ingest of the same input (cmd/kafkabench): a warm-up
# round, then ROUNDS alternating rounds; median and spread (min–max).
ROUNDS ?= 3
.PHONY: bench-kafka
bench-kafka: build
	scripts/services.sh up >/dev/null
	eval "$$(scripts/services.sh env)" && $(GO) run ./cmd/kafkabench --bin $(BIN) --size $(SIZE) --rounds $(ROUNDS) --work $(BENCH_WORK)

# bench-ingest: `rllm-pipe ingest` (GRPO, zstd Parquet) against DuckDB doing
# the same job on the same generated input of SIZE (cached in BENCH_WORK), PAIRS
# alternating runs, traces of SHAPE (steps: 1-4 calls; steps-nomsg; agents, agents-100, agents-text or several comma-separated: the multi-turn comparison, see bench-multiturn);
# prints wall times, the ratio DuckDB / rllm-pipe and peak
# RSS (cmd/ingestbench; BENCH_FLAGS adds flags, e.g. --json FILE).
SIZE  ?= 1GB
PAIRS ?= 3
SHAPE ?= steps
BENCH_WORK ?= $(HOME)/.cache/rllm-pipe/bench
BENCH_FLAGS ?=
.PHONY: bench-ingest
bench-ingest: build
	$(GO) run ./cmd/ingestbench --bin $(BIN) --size $(SIZE) --pairs $(PAIRS) --work $(BENCH_WORK) --shape $(SHAPE) $(BENCH_FLAGS)

# bench-multiturn: issue 16's comparison in one run (cmd/ingestbench/multiturn.go):
# 30- and 100-turn agent traces of MT_SIZE each (and 30 turns with token ids
# like a tokenizer's: gen --tokens text), the same trajectories ingested
# as whole records with --full-prompts (the layout before issue 16), as whole
# records with prefix deltas (default), as wire deltas, and by DuckDB; PAIRS
# rotated rounds; bytes per distinct token, size ratios, wire/whole ingest time,
# peak RSS (flat in turns?), read-back of full prompts through sql and, when
# MT_PYTHON is set (default: the virtualenv of scripts/pytest.sh, if built),
# through the Python client against serve; prints issue 16's aims met / NOT MET.
MT_SIZE   ?= 500MB
MT_PYTHON ?= $(firstword $(wildcard $(HOME)/.cache/rllm-pipe/venv-*/bin/python))
.PHONY: bench-multiturn
bench-multiturn: build
	$(GO) run ./cmd/ingestbench --bin $(BIN) --size $(MT_SIZE) --pairs $(PAIRS) --reads $(PAIRS) --work $(BENCH_WORK) --shape agents,agents-100,agents-text $(if $(MT_PYTHON),--python $(MT_PYTHON)) $(BENCH_FLAGS)

.PHONY: bench-iceberg
# bench-iceberg: the Iceberg projection at 10k and 100k shards (fake: hard
# links of one run's shards, so only the sync and the catalog are measured):
# files added a second, commits a second, the table's open and scan-planning
# time, three rounds each (~10 min).
bench-iceberg:
	$(GO) test -run '^$$' -bench Sync -benchtime 1x -count 3 -timeout 60m ./connectors/iceberg/

# bench-scale: the scaling figures (scripts/bench-scale.sh, ~15-20 min):
# the manifest's commit rate and consumer-group acknowledgements with 1, 4,
# 16 and 64 writers/members (MinIO, one Store's lanes, local and MinIO's raw
# PUT rate side by side), the 10x simulation (docs/capacity.md), then 1
# against 2 Kafka ingest workers pinned one core each (cmd/scalebench); each
# figure the median (min-max) of ROUNDS alternating runs. Starts Kafka and
# MinIO.
.PHONY: bench-scale
bench-scale:
	ROUNDS=$(ROUNDS) scripts/bench-scale.sh

# fuzz: every fuzz target of the tree (found by name), FUZZTIME each
# (default 20s); FUZZ=FuzzDecode runs the targets matching one name.
FUZZTIME ?= 20s
FUZZ ?= Fuzz
fuzz:
	@git grep -h -o '^func $(FUZZ)[A-Za-z0-9_]*' -- '*_test.go' >/dev/null || { echo "no fuzz target matches $(FUZZ)"; exit 1; }
	@git grep -o '^func $(FUZZ)[A-Za-z0-9_]*' -- '*_test.go' | while IFS=: read -r file fn; do \
		fn=$${fn#func }; pkg=./$$(dirname $$file)/; echo "== $$fn $$pkg"; \
		$(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	done

# docs: the command reference (docs/cli.md, docs/cli-iceberg.md) from the
# commands' own help; lint fails when it is not current.
REFERENCE_TESTS := ./cmd/rllm-pipe ./cmd/rllm-pipe-iceberg
docs:
	$(GO) test -count=1 -run '^TestCLIReference$$' $(REFERENCE_TESTS) -args -update-docs

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) test -count=1 -run '^TestCLIReference$$' $(REFERENCE_TESTS)
	$(GO) mod tidy -diff
	$(GO) vet ./...
	GO=$(GO) scripts/layers.sh
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin $(DATA)
