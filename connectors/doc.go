// Package connectors holds the pipeline's edges, one package each:
//
//   - parquet: encodes Arrow record batches to zstd Parquet (the only
//     importer of pqarrow);
//   - sink: rolls batches into shards by size and age and commits them to a
//     Store, with a manifest entry per shard;
//   - local: the local-directory Store, the dead-letter file writer, and the
//     manifest reader (the embedded default: no services needed).
//
// Kafka and S3 connectors join here later, behind the same interfaces.
package connectors
