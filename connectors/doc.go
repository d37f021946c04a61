// Package connectors holds the pipeline's edges, one package each:
//
//   - parquet: encodes Arrow record batches to zstd Parquet and reads them
//     back (the only importer of pqarrow);
//   - sink: rolls batches into shards by size and age and commits them to a
//     Store, with a manifest entry per shard;
//   - local: the local-directory Store, the dead-letter file writer, and the
//     readers of committed shards (the embedded default: no services);
//   - s3: the S3/MinIO Store (a manifest log of create-only objects), its
//     dead-letter objects and readers;
//   - kafka: the Kafka source (consumer-group generations resumed from the
//     manifest), the producer and the dead-letter topic;
//   - duckdb: an embedded DuckDB over committed shards, with views and
//     named reports.
package connectors
