// Package compare holds benchmark-only comparisons of rllm-pipe's
// hand-written hot paths with the libraries that could replace them
// (issue 19, "hand-written only where it wins"):
//
//   - the JSON decoder (ingest.Decoder) against github.com/bytedance/sonic
//     and github.com/minio/simdjson-go, each filling the same
//     schemas.Step and schemas.Trajectory from the same generated records;
//   - the native Parquet page writer (connectors/parquet) against arrow-go's
//     pqarrow writer and github.com/parquet-go/parquet-go's writer, with
//     the same encodings (DELTA_BINARY_PACKED for token ids, PLAIN for the
//     rest, zstd) on the same Arrow records.
//
// It is a nested module with its own go.mod so that the main module does
// not take benchmark-only dependencies. The tests check that every
// contender produces the same records (the decoders) or the same rows
// read back (the writers); the benchmarks time them side by side:
//
//	cd cmd/ingestbench/compare && go test -run '^$' -bench . -count 3
package compare
