package schemas

import "time"

// ShardEntry is one commit as listed in the manifest under the output
// root: a shard (Path set) and the source positions it settles, or a
// checkpoint without a shard (Path empty) that settles dead-lettered and
// dropped records. Paths are relative to the root, with forward slashes.
type ShardEntry struct {
	// Seq is the place in an object-store manifest log of the record
	// that committed the entry (a group commit's record holds several
	// entries, in order).
	Seq int64 `json:"seq,omitempty"`
	// Writer is the run that appended the entry; Nonce tells a retried
	// append that its first attempt landed.
	Writer string `json:"writer,omitempty"`
	Nonce  string `json:"nonce,omitempty"`
	// Claims lists the input streams this entry claims for Writer: from
	// then on, only Writer may settle positions of those streams (a
	// previous owner is fenced).
	Claims []string `json:"claims,omitempty"`
	// Generation is the Kafka consumer-group generation of a claim.
	Generation    int64         `json:"generation,omitempty"`
	Path          string        `json:"path,omitempty"`
	Rows          int64         `json:"rows"`
	Bytes         int64         `json:"bytes"`
	Groups        int           `json:"groups"`
	PolicyVersion int64         `json:"policy_version"` // the partition: the groups' (minimum) policy version
	GroupKeys     []string      `json:"group_keys"`
	Sources       []SourceRange `json:"sources,omitempty"`
	RunID         string        `json:"run_id"`
	SchemaVersion string        `json:"schema_version"`
	CommittedAt   time.Time     `json:"committed_at"`
	// Settled lists, per input stream, the positions whose fate this
	// commit makes durable: the records written in the shard, and records
	// dead-lettered or dropped as retries since the previous commit. A
	// restart skips every settled position, so nothing is lost or doubled.
	Settled Settled `json:"settled,omitempty"`
	// DeadLetters is the dead-letter file and its length made durable by
	// this commit; on restart anything beyond is cut (it will be produced
	// again, its records not being settled).
	DeadLetters *DeadLetterState `json:"dead_letters,omitempty"`
	// Recovered was set, by versions before the manifest became the only
	// truth, on entries rebuilt from a shard's footer; it is kept so that
	// their manifests still read.
	Recovered bool `json:"recovered,omitempty"`
}

// DeadLetterState is a dead-letter file's durable length.
type DeadLetterState struct {
	File  string `json:"file"` // relative to the output root
	Bytes int64  `json:"bytes"`
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
