// Package duckdb is the analysis edge of the pipeline: an in-memory DuckDB
// (embedded through duckdb-go) over the committed output of ingest, a
// local directory or an s3://bucket/prefix, with views for SQL and named
// reports that answer the usual questions of an RL run (reward and pass
// rate by policy version, pass@k per task, staleness, token lengths,
// advantages, dead letters). It backs `rllm-pipe sql`.
//
// # Committed data only
//
// The views read exactly what the manifest commits, never a folder glob:
// the shards listed by manifest entries (an orphan or half-published
// Parquet file in a partition folder is invisible), and, of each
// dead-letter file, the prefix whose length the latest manifest entry
// naming it made durable (lines beyond belong to records that are not
// settled yet; a restart writes them again). On S3 the committed shards
// and dead-letter objects are downloaded to a local folder first (DuckDB's
// httpfs extension is not available in the embedded build), removed by
// Close unless Options.DownloadDir keeps them. Nothing is ever written
// under the output root.
//
// # Read only
//
// Once the views exist, DuckDB is sandboxed (unless
// Options.AllowHostFiles): allowed_paths names exactly the files the views
// read, enable_external_access is off (no other file, no URL, no ATTACH,
// no INSTALL), extensions are neither installed nor loaded, and the
// configuration is locked so that no SET undoes it. Because the files the
// views read could still be written (COPY … TO a shard), DB.Query also
// runs only queries: one SELECT, or EXPLAIN of one; it refuses anything
// else with ErrRefused. Table output escapes control characters (see
// WriteRows).
//
// # Views
//
//   - stored_steps: every row of the committed shards as stored (a delta
//     row's prompt_ids is null), plus shard, prompt_tokens (the whole
//     prompt's length: prompt_prefix_len + len(prompt_delta_ids) for a
//     delta row, else len(prompt_ids)) and response_tokens. What the
//     trajectories view and the token reports read: counting tokens needs
//     no prompt rebuilt.
//   - steps: every row of the committed shards (schemas.StepSchema, one
//     row per step) with whole prompts and messages, plus shard, the
//     manifest path of the row's shard.
//   - trajectories: one row per (group_id, group_version, trajectory_id):
//     task_id, role, reward, num_steps, steps (rows), prompt_tokens and
//     response_tokens (sums over the steps of stored_steps' counts),
//     min_policy_version and max_policy_version, is_correct,
//     termination_reason, partial, filter_reason, advantage (of the first
//     step; ingest broadcasts one value per trajectory), estimator,
//     group_size, expected_group_size, shard, and pass.
//   - groups: one row per (group_id, group_version): task_id, role,
//     trajectories, steps, reward_mean, reward_std (population, ddof 0),
//     reward_min, reward_max, passes, partial, group_size,
//     expected_group_size, shard.
//   - shards: the manifest entries that list a shard, in manifest order:
//     seq (the entry's place in the manifest: its line number, from 0, in a
//     local _manifest/shards.jsonl, its record's number on S3, which the
//     entries of one group commit share), path, rows,
//     bytes, groups, policy_version, committed_at, run_id, writer,
//     recovered, schema_version, file (the local file read: a compacted
//     file, connectors/compact, when one holds the shard's rows). After a
//     compaction it is a view: the rows of the shards the compaction has
//     looked at are read from its snapshot file, the others from a table
//     (rllm_shards_after_snapshot), and the manifest is read only after
//     the snapshot, so that opening does not grow with the run.
//   - dead_letters: the committed dead-letter lines: reason, error, stream
//     and position (topic/partition and offset for Kafka input, file and
//     line for files), the raw source fields, record (base64 when
//     record_encoding says so), truncated, size, dlq_file.
//   - dead_letter_commits: per manifest entry (seq, committed_at),
//     dead-letter file and reason, the dead letters that entry committed:
//     a line belongs to the first entry, in manifest order, whose mark
//     (DeadLetterState.Bytes) on its file covers the line's end. Open
//     counts them while reading the committed lines; the view holds the
//     counts as values.
//   - consumed: what every consumer group under the root acknowledged,
//     one row per group of each batch: consumer_group, train_step (the
//     batch's place in the group's acknowledgements), member, batch_id,
//     policy_version (at the acknowledgement), group_id, group_version,
//     staleness, trajectories, steps, shard, acked_at (docs/audit-and-replay.md#the-consumed-table).
//
// steps gives every row its whole prompt_ids and messages: multi-turn
// prompts stored as prefix deltas (schema 4) are rebuilt by window
// functions (WholePrompts).
//
// A trajectory passes when coalesce(is_correct, reward > 0): its
// is_correct flag when the reward function set one, else a positive
// reward.
//
// This package imports schemas, train (the consumer groups' logs) and the
// store, local and compact connectors (an S3 output comes as a store.Reader);
// nothing in the pipeline imports it.
package duckdb
