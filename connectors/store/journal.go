package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
)

// Journal is a linear log kept as create-only objects in a folder:
// records <seq>.json numbered from 0, and snapshots snap-<seq>.json of the
// state after record seq, so that a reader starts from the newest
// snapshot instead of record 0, and old records can go. It is the
// protocol under the S3 manifest and the consumer groups' logs; what a
// record means is the caller's.
//
// Appends: a writer reads to the end of the log, then creates the next
// number; of two writers racing for a number exactly one wins, and the
// loser reads on and tries the next, so every writer that appends has read
// every record before its own.
//
// Compaction deletes the records below the second newest snapshot, in
// ascending order, so that the deleted records are always a prefix of the
// log, also when two members compact at once or one is killed midway.
// That makes a deleted slot recognisable: record seq-1 is gone too. A
// writer that slept through compactions and creates a slot that was
// deleted (create-only succeeds there) sees it at once and gets ErrStale:
// it reloads from the newest snapshot and, if its record is not reflected
// there, builds it again (a record that lands in a hole is never read,
// and the next compaction removes it). A reader that finds the slot after its last
// record missing checks the same way that it is really at the end
// (Behind).
type Journal struct {
	obj Objects
}

// ErrStale is an append into the compacted part of a journal: the
// appender was behind the newest snapshot and must reload.
var ErrStale = errors.New("store: journal: behind the compacted part of the log: reload from the newest snapshot")

// NewJournal returns the journal in obj.
func NewJournal(obj Objects) *Journal { return &Journal{obj: obj} }

// RecordName is the object name of record seq.
func RecordName(seq int64) string { return fmt.Sprintf("%020d.json", seq) }

// SnapshotName is the object name of the snapshot after record seq.
func SnapshotName(seq int64) string { return fmt.Sprintf("snap-%020d.json", seq) }

// ParseNumbered returns n of an object named <prefix><n>.json with n in
// 20 digits (RecordName, SnapshotName and their kin); false for any other
// name.
func ParseNumbered(name, prefix string) (int64, bool) {
	s, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, ".json")
	if !ok || len(s) != 20 {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n >= 0
}

// Latest returns the newest snapshot and the record it follows; ok is
// false when there is none (start from record 0). A snapshot removed by a
// compaction between the listing and the read is skipped for a newer one.
func (j *Journal) Latest(ctx context.Context) (data []byte, seq int64, ok bool, err error) {
	for attempt := 0; attempt < 10; attempt++ {
		names, err := j.obj.List(ctx, "snap-")
		if err != nil {
			return nil, 0, false, fmt.Errorf("journal: list snapshots: %w", err)
		}
		var newest string
		for _, n := range names {
			if s, ok := ParseNumbered(n, "snap-"); ok && (newest == "" || s > seq) {
				newest, seq = n, s
			}
		}
		if newest == "" {
			return nil, 0, false, nil
		}
		data, err = j.obj.Get(ctx, newest)
		if errors.Is(err, fs.ErrNotExist) {
			continue // compacted away meanwhile: list again
		}
		if err != nil {
			return nil, 0, false, fmt.Errorf("journal: read snapshot %s: %w", newest, err)
		}
		return data, seq, true, nil
	}
	return nil, 0, false, errors.New("journal: snapshots keep disappearing")
}

// Read returns record seq, or an error wrapping fs.ErrNotExist past the
// end (or in the compacted part: see Behind).
func (j *Journal) Read(ctx context.Context, seq int64) ([]byte, error) {
	return j.obj.Get(ctx, RecordName(seq))
}

// Next returns record next for a reader that has read the ones before:
// its data; or nil at the end of the log; or behind, when the log was
// compacted past next and the reader must reload from the newest snapshot.
func (j *Journal) Next(ctx context.Context, next int64) (data []byte, behind bool, err error) {
	data, err = j.Read(ctx, next)
	if errors.Is(err, fs.ErrNotExist) {
		behind, err = j.Behind(ctx, next)
		return nil, behind, err
	}
	return data, false, err
}

// Behind reports, for a reader whose next record next is missing, whether
// that is because the log was compacted past it (reload from the newest
// snapshot) rather than because it is at the end.
func (j *Journal) Behind(ctx context.Context, next int64) (bool, error) {
	if next == 0 {
		// Record 0 has no predecessor: the log was compacted past it if
		// there is a snapshot (a snapshot follows a record).
		snaps, err := j.obj.List(ctx, "snap-")
		return len(snaps) > 0, err
	}
	_, err := j.obj.Get(ctx, RecordName(next-1))
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	return false, err
}

// Append creates record seq. It returns an error wrapping fs.ErrExist if
// the number is taken (read on and try the next; after a retried request
// the record there may be the caller's own: compare a nonce), and
// ErrStale if seq lies in the compacted part of the log.
func (j *Journal) Append(ctx context.Context, seq int64, data []byte) error {
	if err := j.obj.Create(ctx, RecordName(seq), data); err != nil {
		return err
	}
	behind, err := j.Behind(ctx, seq)
	if err != nil {
		return fmt.Errorf("journal: check record %d: %w", seq, err)
	}
	if behind {
		// Nobody reads here: the log's readers are past seq, and a reader
		// as far behind reloads before it reads on. (It can also be that
		// the record landed in time and the log was compacted past it
		// before this check: the snapshot the caller reloads then has
		// it.)
		return ErrStale
	}
	return nil
}

// Snapshot stores the state after record seq (which exists), then
// compacts: records below the previous snapshot, and snapshots older than
// it, are deleted. A failure to snapshot or compact costs readers time
// only, and the next snapshot tries again, so it is returned for logging.
func (j *Journal) Snapshot(ctx context.Context, seq int64, state []byte) error {
	if err := j.obj.Create(ctx, SnapshotName(seq), state); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("journal: snapshot %d: %w", seq, err)
	}
	return j.Compact(ctx)
}

// Compact deletes the records below the second newest snapshot, oldest
// first, and the snapshots older than it. Records below the newest
// snapshot stay readable for the readers that loaded the previous one.
func (j *Journal) Compact(ctx context.Context) error {
	names, err := j.obj.List(ctx, "")
	if err != nil {
		return fmt.Errorf("journal: list: %w", err)
	}
	var snaps []int64
	for _, n := range names {
		if s, ok := ParseNumbered(n, "snap-"); ok {
			snaps = append(snaps, s)
		}
	}
	if len(snaps) < 2 {
		return nil
	}
	horizon := snaps[len(snaps)-2] // List is sorted, and so are the names
	// Records first, ascending: the deleted records stay a prefix.
	for _, n := range names {
		if s, ok := ParseNumbered(n, ""); ok && s < horizon {
			if err := j.obj.Delete(ctx, n); err != nil {
				return fmt.Errorf("journal: compact: %w", err)
			}
		}
	}
	for _, s := range snaps[:len(snaps)-2] {
		if err := j.obj.Delete(ctx, SnapshotName(s)); err != nil {
			return fmt.Errorf("journal: compact: %w", err)
		}
	}
	return nil
}
