// Package iceberg projects an output root's committed shards into an
// Apache Iceberg table, so that lakehouse engines (Spark, Trino,
// pyiceberg, DuckDB's iceberg extension) read the same rows as
// `rllm-pipe sql`, with snapshot isolation, partition pruning by policy
// version and time travel.
//
// The projection adds the shards' Parquet files as they are (no rewrite:
// their footers give Iceberg its column statistics), partitioned by
// identity(group_version). The manifest stays the only truth; the table
// can be dropped and rebuilt from it at any time.
//
// # Exactly once
//
// Each snapshot the syncer commits records, in its summary, how many of
// the manifest's committed shards it covers (PropShards, in the order of
// store.Reader.Committed) and the path of the last (PropLastShard). A
// sync reads that position from the table's current snapshot (walking
// back through parents past snapshots others made), adds the shards after
// it, and commits the files and the new position in one catalog commit
// that requires the table to be at the snapshot it read. The table's
// commit.retry.num-retries is 0, so that a commit that lost a race is not
// replayed onto the winner's snapshot (which may hold the same files): it
// fails, and the syncer reads the position again. A crash anywhere —
// before the commit, inside it, after it — leaves the table at the old
// position or the new one, and the next sync goes on from there: a re-run,
// a second syncer or a crash adds nothing twice and skips nothing.
//
// # Shards of several versions
//
// A shard holds one policy version unless ingest had more versions open
// than --max-partitions; such a shard cannot sit in one identity
// partition, so its rows are written again, one file per version, under
// the table's data folder (named after the shard and the attempt: a
// syncer that lost a race leaves orphan files, never rewrites a listed
// one), and those files are added instead.
package iceberg
