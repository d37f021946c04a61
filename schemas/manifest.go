package schemas

import "time"

// ShardEntry is one committed shard as listed in the manifest under the
// output root. Paths are relative to the root, with forward slashes.
type ShardEntry struct {
	Path          string        `json:"path"`
	Rows          int64         `json:"rows"`
	Bytes         int64         `json:"bytes"`
	Groups        int           `json:"groups"`
	PolicyVersion int64         `json:"policy_version"` // the partition: the groups' (minimum) policy version
	GroupKeys     []string      `json:"group_keys"`
	Sources       []SourceRange `json:"sources,omitempty"`
	RunID         string        `json:"run_id"`
	SchemaVersion string        `json:"schema_version"`
	CommittedAt   time.Time     `json:"committed_at"`
	// Recovered is set on entries rebuilt from a shard's footer after a
	// crash between publishing the shard and appending its entry.
	Recovered bool `json:"recovered,omitempty"`
}

// SourceRange is the span of input a shard's rows came from.
type SourceRange struct {
	File      string `json:"file,omitempty"`
	FirstLine int64  `json:"first_line,omitempty"`
	LastLine  int64  `json:"last_line,omitempty"`
}

// Footer keys under which a shard carries its own manifest entry, so that
// the manifest can be rebuilt from the shards.
const (
	FooterEntryKey  = "rllm_pipe.shard"
	FooterSchemaKey = "rllm_pipe.schema_version"
)
