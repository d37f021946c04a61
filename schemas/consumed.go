package schemas

import "time"

// ConsumedGroup is one group of a batch a consumer group acknowledged.
type ConsumedGroup struct {
	Shard        string `json:"shard"`   // its shard's manifest path
	Ordinal      int32  `json:"ordinal"` // its place in the shard
	GroupID      string `json:"group_id"`
	GroupVersion int64  `json:"group_version"`
	Trajectories int32  `json:"trajectories"` // delivered (rows a filter dropped do not count)
	Steps        int64  `json:"steps"`        // step rows delivered
}

// ConsumedBatch is one batch a consumer group acknowledged, as its log's
// audit records it (train writes and reads the log; the SQL views show it).
type ConsumedBatch struct {
	// Seq is the acknowledgement's place in the group's log: the order
	// in which the group acknowledged its batches.
	Seq           int64     `json:"seq"`
	Member        string    `json:"member"`
	Time          time.Time `json:"time"`
	BatchID       uint64    `json:"batch_id"`
	PolicyVersion int64     `json:"policy_version"`
	// Groups are those the acknowledgement settled, in batch order (a
	// group of a shard the member had lost is not among them).
	Groups []ConsumedGroup `json:"groups"`
}

// VersionCount is a number of groups of one policy version (a consumer
// group's stale skips, as its log counts them).
type VersionCount struct {
	Version int64 `json:"version"`
	Groups  int64 `json:"groups"`
}
