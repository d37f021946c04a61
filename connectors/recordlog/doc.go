// Package recordlog is an append-only log of wire-format records (JSON
// lines) on local disk: the capture gateway's record-log output and the
// write-ahead log in front of its in-process pipeline.
//
// Durability: concurrent Write calls are batched into one write and one
// fsync (group commit); a Write returns once its records are fsynced, and
// a failed write is cut back, so the file only ever holds whole lines. On
// Open, a torn last line left by a crash is truncated: what a Write
// acknowledged is never lost, and half a record is never read.
//
// Files: every file starts with a 64 KiB header of whitespace (blank
// lines, which readers skip) that holds a random nonce. The header makes
// a file's identity fixed from its creation: `rllm-pipe ingest --from
// FILE` names a file's stream by its path and the fingerprint of its
// first 64 KiB, so a log file read while it was short and read again once
// grown is still the same stream, and a rerun skips what it settled. The
// nonce also makes every file a stream of its own (Segment.Stream), even
// at a reused path.
//
// With Options.MaxFileBytes 0 the log is the one file at its path; with a
// bound it rotates into numbered segments (wal.jsonl → wal.00000001.jsonl,
// wal.00000002.jsonl, ...), each an ordinary JSON-lines input, and sealed
// segments may be removed once everything in them is settled (Remove).
//
// A Tail reads the log as it grows (an ingest.Source that never ends on
// its own): it hands out records up to the durable end only, so it never
// sees bytes a failed write cuts back.
//
// The package imports ingest and schemas only; it must not import the
// pipeline stages.
package recordlog
