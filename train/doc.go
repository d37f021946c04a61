// Package train is the trainer side: it reads committed shards (only those
// a manifest lists), skips groups staler than the trainer allows and rows
// a filter marked, and forms micro-batches by token budget without ever
// splitting a group, applying a batch-level advantage estimator when asked.
//
// A Reader reads a fixed list of shard files. A Consumer is a member of a
// consumer group: it follows the manifest as shards commit, shares the
// shards with the other members through leases recorded in a log of
// create-only objects in the store itself (no server), and settles every
// group exactly once by acknowledgement or skip, so a restart resumes
// after the last acknowledgement and a crashed member's work moves on
// after its lease times out. The done shards at the front of the
// manifest are folded into the group's low watermark, where a member
// starts reading the manifest, so a group's state and a member's start
// stay small however long the run. Package train/flight serves Consumers
// to trainers over Arrow Flight.
package train
