// Package syncresult is what an Iceberg sync did, in a package of its
// own: rllm-pipe reads the results its rllm-pipe-iceberg child prints
// without linking iceberg-go (connectors/iceberg, whose package
// initialisation every command would pay).
package syncresult

// Result is what a sync did.
type Result struct {
	Shards    int   `json:"shards"`    // shards added
	Rows      int64 `json:"rows"`      // rows they hold
	Split     int   `json:"split"`     // shards of several versions written as one file per version
	Commits   int   `json:"commits"`   // snapshots committed
	Conflicts int   `json:"conflicts"` // commits that lost a race and were recomputed
	Position  int   `json:"position"`  // committed shards the table holds now
	Snapshot  int64 `json:"snapshot"`  // the table's current snapshot id (0: none yet)
	// Trajectories are the rows added to the trajectories table.
	Trajectories int64 `json:"trajectories"`
	// DeadLetters are the dead-letter lines added to the dead_letters
	// table.
	DeadLetters int64 `json:"dead_letters"`
	// DeadLetterBytesMissing are committed bytes of dead-letter files
	// that are gone or cut short (an outside --dlq file removed): left
	// out, as sql leaves them.
	DeadLetterBytesMissing int64 `json:"dead_letter_bytes_missing,omitempty"`
}

// Add sums r into res: the counts of both syncs, and r's position and
// snapshot (the later).
func (res *Result) Add(r Result) {
	res.Shards += r.Shards
	res.Rows += r.Rows
	res.Split += r.Split
	res.Commits += r.Commits
	res.Conflicts += r.Conflicts
	res.Trajectories += r.Trajectories
	res.DeadLetters += r.DeadLetters
	res.DeadLetterBytesMissing = r.DeadLetterBytesMissing
	if r.Position >= res.Position {
		res.Position, res.Snapshot = r.Position, r.Snapshot
	}
}
