// Package schemas is the leaf of rllm-pipe: the wire records (Step and
// Trajectory), the reason codes of rejected input, and the Arrow schema of a
// committed shard. Every other package imports it; it imports nothing of the
// project and no connector library.
//
// The wire format is JSON, one record per line (or per Kafka message), told
// apart by "type". See README.md in this folder for the field tables and an
// example of each record.
package schemas
