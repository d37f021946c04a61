package local

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// A writer needs from the manifest only what it folds into a few
// figures: the positions settled, the writers that wrote here, and the
// durable length of each dead-letter file. It keeps them in
// _manifest/state.json (replaced by rename: every stateEvery appends and
// at Close), with the manifest length they cover, so that opening reads
// the state and the manifest after it, not every commit ever made.
//
// Orphans need more: whether a shard is listed. Only writers that died
// can leave them (a writer that closes sweeps its own), and every entry of
// a writer lies after its registration in writers.jsonl, which records
// the manifest's length then. So the next writer reads the manifest from
// the registration of the oldest dead writer not yet cleaned up, removes
// their orphans, and records them as cleaned.

// StateFile is the writer state's name in _manifest.
const StateFile = "state.json"

// stateEvery is how many appends separate two writes of the state (a
// variable for tests).
var stateEvery = 4096

// writerState is state.json.
type writerState struct {
	Offset      int64            `json:"offset"`  // manifest bytes folded in
	Entries     int64            `json:"entries"` // entries in them
	Settled     schemas.Settled  `json:"settled,omitempty"`
	Writers     []string         `json:"writers,omitempty"`
	DeadLetters map[string]int64 `json:"dead_letters,omitempty"` // durable lengths
	// Marks are places in the manifest where a reader may start: a line's
	// byte offset, with the entries and the shard entries before it. The
	// last one is where the state ends. A consumer that needs the shards
	// from the nth on starts at the last mark with at most n before it
	// (Reader.CommittedFrom) instead of decoding the whole manifest.
	Marks []mark `json:"marks,omitempty"`
}

// mark is a place in the manifest (writerState.Marks).
type mark struct {
	Offset  int64 `json:"offset"`
	Entries int64 `json:"entries"`
	Shards  int64 `json:"shards"`
}

// markGap is the least number of entries between two marks: a state
// written sooner after the last mark (a short run's Close) moves it.
const markGap = 1024

// readMarks returns the marks of the state under root (none if it cannot
// be read: start at the beginning).
func readMarks(root string) []mark {
	st, err := readState(root)
	if err != nil {
		return nil
	}
	return st.Marks
}

func readState(root string) (writerState, error) {
	var st writerState
	data, err := os.ReadFile(filepath.Join(root, ManifestDir, StateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("local: read writer state: %w", err)
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return writerState{}, nil // unreadable: read the whole manifest instead
	}
	return st, nil
}

// writeState replaces state.json. Callers hold mu.
func (s *Store) writeState() error {
	m := mark{Offset: s.size, Entries: s.count, Shards: s.shardCount}
	if n := len(s.marks); n > 0 && s.marks[n-1].Offset == m.Offset {
		// nothing appended since
	} else if n > 1 && m.Entries-s.marks[n-2].Entries < markGap {
		s.marks[n-1] = m
	} else {
		s.marks = append(s.marks, m)
	}
	st := writerState{Offset: s.size, Entries: s.count, Settled: s.settled, DeadLetters: s.durable, Marks: s.marks}
	for w := range s.known {
		st.Writers = append(st.Writers, w)
	}
	slices.Sort(st.Writers)
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	dir := filepath.Join(s.root, ManifestDir)
	tmp := filepath.Join(dir, StateFile+".tmp")
	step("write state")
	if err := writeSynced(tmp, data); err != nil {
		return fmt.Errorf("local: write writer state: %w", err)
	}
	step("replace state")
	if err := os.Rename(tmp, filepath.Join(dir, StateFile)); err != nil {
		return fmt.Errorf("local: write writer state: %w", err)
	}
	s.sinceState = 0
	return syncDir(dir)
}

func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

// writerLine is a line of _manifest/writers.jsonl: a writer registered
// (with the manifest's length then), or one that closed or whose orphans
// the next writer removed.
type writerLine struct {
	Writer string    `json:"writer"`
	PID    int       `json:"pid,omitempty"`
	Opened time.Time `json:"opened,omitzero"`
	Offset int64     `json:"offset"`
	Closed bool      `json:"closed,omitempty"`
}

// registry is writers.jsonl read: every writer, and the registration
// offsets of those never closed (dead, or alive elsewhere: not while we
// hold the lock).
type registry struct {
	all  []string
	open map[string]int64
}

func readWriters(root string) (registry, error) {
	r := registry{open: map[string]int64{}}
	data, err := os.ReadFile(filepath.Join(root, ManifestDir, WritersFile))
	if errors.Is(err, fs.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return r, fmt.Errorf("local: read writers: %w", err)
	}
	for _, l := range bytes.Split(data, []byte("\n")) {
		var w writerLine
		if json.Unmarshal(l, &w) != nil || w.Writer == "" {
			continue // a torn last line
		}
		if w.Closed {
			delete(r.open, w.Writer)
			continue
		}
		r.all = append(r.all, w.Writer)
		r.open[w.Writer] = w.Offset
	}
	return r, nil
}

// appendWriters adds lines to writers.jsonl, synced.
func (s *Store) appendWriters(lines ...writerLine) error {
	if len(lines) == 0 {
		return nil
	}
	var buf bytes.Buffer
	for _, l := range lines {
		b, _ := json.Marshal(l)
		buf.Write(append(b, '\n'))
	}
	f, err := os.OpenFile(filepath.Join(s.root, ManifestDir, WritersFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("local: writers: %w", err)
	}
	step("append writers")
	_, err = f.Write(buf.Bytes())
	if err == nil {
		err = f.Sync()
	}
	if err = errors.Join(err, f.Close()); err != nil {
		return fmt.Errorf("local: writers: %w", err)
	}
	return nil
}
