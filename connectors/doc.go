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
//     (the capture gateway's record-log output and write-ahead log).
package connectors
