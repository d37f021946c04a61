// Package connectors holds the pipeline's edges, one package each, and
// OpenStore and OpenReader, which turn an output root's URL (a path,
// file:///path or s3://bucket/prefix) into a store.Store or store.Reader:
//
//   - store: the one interface to an output root (shards, manifest, dead
//     letters, claims, consumer-group objects) and, in storetest, the
//     conformance suite every backend passes;
//   - parquet: encodes Arrow record batches to zstd Parquet and reads them
//     back (the only importer of pqarrow);
//   - sink: rolls batches into shards by size and age and commits them to a
//     Store, with a manifest entry per shard;
//   - local: the local-directory store (the embedded default: no
//     services), one writer at a time under an OS lock;
//   - s3: the S3/MinIO store (a manifest log of create-only objects, with
//     claims that fence a stream's previous writer);
//   - kafka: the Kafka source (consumer-group generations resumed from the
//     manifest), the producer and the dead-letter topic;
//   - duckdb: an embedded DuckDB over committed shards, with views and
//     named reports;
//   - compact: merges runs of small committed shards into larger files
//     that duckdb's views read instead (the manifest and shards stay);
//   - recordlog: an append-only log of wire-format records on local disk
//     (the capture gateway's record-log output and write-ahead log);
//   - pipeline: the runtime that wires a source, the transform stage and a
//     sink into ingest's exactly-once loop (a file or stdin, or a Kafka
//     consumer group), with its metrics in pipeline/metrics;
//   - gatewayout: the capture gateway's outputs (a Kafka topic, a record
//     log, or a shard root with the pipeline in-process) opened from a URL.
//
// The folders above connectors (train, cmd) may import it; it imports
// transform, ingest, advantage and schemas, never train or cmd.
package connectors
