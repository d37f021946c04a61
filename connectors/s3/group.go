package s3

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"strings"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Group commit: many writers, one log, one record for many entries.
//
// Writers that race for the next record of one log commit at the rate of
// one record per round trip whatever their number, and every loser pays
// a refused PUT and a re-read: the more writers, the fewer commits. A
// shard entry that lost its first race is staged instead: its writer
// puts it, create-only, as _manifest/staged/<path escaped>.json, and then
// seals: it lists the staged entries, reads those it has not read, and
// appends one record holding every one not yet in the log (in name
// order), each checked against the log as its own writer would have
// (fenced entries are listed as rejected, so that their writers learn
// it). Of the writers sealing at once one wins and the others find their
// entries in its record: the records stay one a round trip, but each
// commits every entry staged meanwhile.
//
// What stays true:
//   - The log is linear and a sealer has read every record before its
//     own, so each entry is checked against everything before it, as a
//     direct append is.
//   - An entry lands once: a staged entry already in the log (by its
//     path, unique to a shard) is left out, and a staged object is
//     deleted only after the record holding (or rejecting) it is in the
//     log, so a sealer killed anywhere leaves it to the next.
//   - A staged entry's shard is not an orphan while the staged object
//     exists (removeUnlisted lists them before re-reading the log).
//   - A claim seals what is staged first: a writer that takes a stream
//     over sees every entry its previous owner staged either in the log
//     before its claim (settled: skipped) or rejected after it (fenced).
//
// Only shard entries without dead letters are staged (a path names them
// uniquely, and no other object hangs on them); claims and dead-letter
// marks are appended directly.

// stagedDir is the folder of staged entries, under the manifest's.
const stagedDir = store.ManifestDir + "/staged"

// batchRecord is a manifest record that commits several entries: the
// record's entries in order, and the staged entries it turned down.
type batchRecord struct {
	Batch    []schemas.ShardEntry `json:"batch"`
	Rejected []rejectedEntry      `json:"rejected,omitempty"`
}

// rejectedEntry is a staged entry a sealer found fenced.
type rejectedEntry struct {
	Writer string `json:"writer"`
	Path   string `json:"path"`
	Stream string `json:"stream"`
}

// decodeRecord returns the entries of a manifest record: one entry, or a
// group commit's batch.
func decodeRecord(data []byte) ([]schemas.ShardEntry, []rejectedEntry, error) {
	var probe struct {
		Batch json.RawMessage `json:"batch"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return nil, nil, err
	}
	if probe.Batch == nil {
		var e schemas.ShardEntry
		if err := json.Unmarshal(data, &e); err != nil {
			return nil, nil, err
		}
		return []schemas.ShardEntry{e}, nil, nil
	}
	var b batchRecord
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, nil, err
	}
	return b.Batch, b.Rejected, nil
}

// stagedName is the staged object of the shard at rel.
func stagedName(rel string) string { return url.QueryEscape(rel) + ".json" }

// stagedPath is the shard path a staged object names ("" for another
// name).
func stagedPath(name string) string {
	base, ok := strings.CutSuffix(name, ".json")
	if !ok {
		return ""
	}
	p, err := url.QueryUnescape(base)
	if err != nil {
		return ""
	}
	return p
}

// stageable says whether e may be group committed.
func stageable(e schemas.ShardEntry) bool {
	return e.Path != "" && e.DeadLetters == nil && len(e.Claims) == 0
}

// appendStaged stages e (a shard entry whose writer lost a race for the
// log) and seals until it is in the log (nil) or rejected (ErrFenced).
func (s *Store) appendStaged(ctx context.Context, e schemas.ShardEntry) error {
	data, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("s3: encode manifest entry: %w", err)
	}
	name := stagedName(e.Path)
	if err := s.staged.Create(ctx, name, data); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("s3: stage the entry of %s: %w", e.Path, err)
	}
	for attempt := 0; ; attempt++ {
		if attempt > 1000 {
			return fmt.Errorf("s3: manifest append: too much contention")
		}
		if err := s.refresh(ctx); err != nil {
			return err
		}
		if done, err := s.stagedOutcome(ctx, e); done {
			return err
		}
		listed, err := s.seal(ctx)
		if err != nil {
			return err
		}
		if !listed[name] {
			// Gone before it was in the log we read: the record that
			// settled it came after that read (read on), or it was
			// rejected in a record a snapshot folded away.
			if err := s.refresh(ctx); err != nil {
				return err
			}
			if done, err := s.stagedOutcome(ctx, e); done {
				return err
			}
			return fmt.Errorf("%w: the staged entry of %s was rejected", ErrFenced, e.Path)
		}
	}
}

// stagedOutcome reports whether the staged entry e has an outcome: in
// the log (nil) or rejected (ErrFenced).
func (s *Store) stagedOutcome(ctx context.Context, e schemas.ShardEntry) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, err := s.inLog(ctx, e)
	if err != nil {
		return true, err
	}
	if in {
		return true, nil
	}
	if r, ok := s.rejected[e.Path]; ok {
		delete(s.rejected, e.Path)
		return true, fmt.Errorf("%w: %s", ErrFenced, r.Stream)
	}
	return false, nil
}

// inLog reports whether the log holds the entry e: lists its shard, or
// settles all its positions (a log restored from a snapshot folds the
// positions of every entry, but lists only the entries after its sealed
// segments until they are read: they are read only for an entry that
// settles nothing). Callers hold mu.
func (s *Store) inLog(ctx context.Context, e schemas.ShardEntry) (bool, error) {
	if s.log.Listed(e.Path) || s.log.SettledAll(e.Settled) {
		return true, nil
	}
	if len(e.Settled) == 0 && !s.log.Loaded() {
		if err := s.loaded(ctx); err != nil {
			return false, err
		}
		return s.log.Listed(e.Path), nil
	}
	return false, nil
}

// seal appends one record of every staged entry not in the log yet, if
// there is any; losing the race for the record is not an error (the
// caller reads the winner's). It returns the staged names it listed.
func (s *Store) seal(ctx context.Context) (map[string]bool, error) {
	names, err := s.staged.List(ctx, "")
	if err != nil {
		return nil, err
	}
	listed := make(map[string]bool, len(names))
	for _, n := range names {
		listed[n] = true
	}
	return listed, s.sealListed(ctx, names)
}

// sealListed is seal of the staged names listed.
func (s *Store) sealListed(ctx context.Context, names []string) error {
	s.mu.Lock()
	var fetch []string
	for _, n := range names {
		if p := stagedPath(n); p != "" && !s.log.Listed(p) {
			if _, ok := s.stagedCache[n]; !ok {
				fetch = append(fetch, n)
			}
		}
	}
	s.mu.Unlock()
	got := map[string]schemas.ShardEntry{}
	for _, n := range fetch {
		data, err := s.staged.Get(ctx, n)
		if errors.Is(err, fs.ErrNotExist) {
			continue // sealed and deleted meanwhile
		}
		if err != nil {
			return err
		}
		var e schemas.ShardEntry
		if err := json.Unmarshal(data, &e); err != nil || e.Path != stagedPath(n) || !stageable(e) {
			slog.Warn("s3: a staged manifest entry is not one; left alone", "name", n, "err", err)
			continue
		}
		got[n] = e
	}
	s.mu.Lock()
	for n, e := range got {
		s.stagedCache[n] = e
	}
	var rec batchRecord
	var done []string // staged names the record settles
	seen := map[string]bool{}
	present := map[string]bool{}
	for _, n := range names {
		present[n] = true
		e, ok := s.stagedCache[n]
		if !ok {
			continue
		}
		in, err := s.inLog(ctx, e)
		if err != nil {
			s.mu.Unlock()
			return err
		}
		if in || seen[e.Path] {
			done = append(done, n) // in the log already: only the object is left
			continue
		}
		seen[e.Path] = true
		done = append(done, n)
		if st := s.log.Fenced(&e, e.Writer); st != "" {
			rec.Rejected = append(rec.Rejected, rejectedEntry{Writer: e.Writer, Path: e.Path, Stream: st})
			continue
		}
		if s.log.SettledAny(e.Settled) {
			// Some of its positions are settled by another entry: the
			// entry would commit their records twice.
			rec.Rejected = append(rec.Rejected, rejectedEntry{Writer: e.Writer, Path: e.Path, Stream: "positions already settled"})
			continue
		}
		rec.Batch = append(rec.Batch, e)
	}
	for n := range s.stagedCache {
		if !present[n] {
			delete(s.stagedCache, n) // gone: sealed and deleted by another
		}
	}
	seq := s.next
	s.mu.Unlock()
	if len(rec.Batch) == 0 && len(rec.Rejected) == 0 {
		return s.dropStaged(ctx, done)
	}
	for i := range rec.Batch {
		rec.Batch[i].Seq = seq
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("s3: encode manifest record: %w", err)
	}
	switch err := s.journal.Append(ctx, seq, data); {
	case err == nil:
		s.mu.Lock()
		if seq == s.next {
			s.applyRecord(rec.Batch, rec.Rejected)
		}
		s.mu.Unlock()
		s.maybeSnapshot(ctx, seq)
		return s.dropStaged(ctx, done)
	case errors.Is(err, store.ErrStale):
		s.mu.Lock()
		defer s.mu.Unlock()
		if err := s.reload(ctx); err != nil {
			return err
		}
		return s.loaded(ctx)
	case errors.Is(err, fs.ErrExist):
		// Another record got there first (perhaps our own earlier
		// attempt, whose answer was lost: its entries are then in the log
		// the caller reads next, and sealing again leaves them out).
		return nil
	default:
		return err
	}
}

// dropStaged deletes staged objects whose entries are in the log or
// rejected (best effort: the next sealer finds them settled and tries
// again).
func (s *Store) dropStaged(ctx context.Context, names []string) error {
	for _, n := range names {
		if err := s.staged.Delete(ctx, n); err != nil {
			slog.Warn("s3: remove a sealed staged entry", "name", n, "err", err)
			return nil
		}
		s.mu.Lock()
		delete(s.stagedCache, n)
		s.mu.Unlock()
	}
	return nil
}

// applyRecord applies a record's entries, the next record's, and notes
// the rejections of this writer's staged entries. Callers hold mu.
func (s *Store) applyRecord(entries []schemas.ShardEntry, rejected []rejectedEntry) {
	for _, e := range entries {
		e.Seq = s.next
		s.log.Apply(e)
	}
	for _, r := range rejected {
		if r.Writer == s.writer {
			s.rejected[r.Path] = r
		}
	}
	s.next++
}

// maybeSnapshot snapshots the log after record seq when seq is a
// snapshot's place.
func (s *Store) maybeSnapshot(ctx context.Context, seq int64) {
	if seq == 0 || seq%s.snapEvery != 0 {
		return
	}
	s.mu.Lock()
	if s.next != seq+1 {
		s.mu.Unlock()
		return
	}
	snapped := s.log
	snap, segs, err := s.log.Snapshot(s.next, s.segSize)
	s.mu.Unlock()
	if err == nil {
		err = s.snapshot(ctx, seq, snap, segs, snapped)
	}
	if err != nil {
		slog.Warn("s3: manifest snapshot", "err", err) // costs readers time only
	}
}

// stagedPaths returns the shard paths of the staged entries: not orphans
// while staged.
func (s *Store) stagedPaths(ctx context.Context) (map[string]bool, error) {
	names, err := s.staged.List(ctx, "")
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, n := range names {
		if p := stagedPath(n); p != "" {
			out[p] = true
		}
	}
	return out, nil
}

// sealStaged seals until every entry staged before it began is in the
// log or rejected: a claim calls it first, so that the entries a
// stream's previous owner staged come before the claim or are fenced by
// it. (Entries staged after it began are the next sealer's.)
func (s *Store) sealStaged(ctx context.Context) error {
	var before map[string]bool
	for attempt := 0; ; attempt++ {
		if attempt > 1000 {
			return fmt.Errorf("s3: seal staged entries: too much contention")
		}
		if err := s.refresh(ctx); err != nil {
			return err
		}
		names, err := s.staged.List(ctx, "")
		if err != nil {
			return err
		}
		if before == nil {
			before = make(map[string]bool, len(names))
			for _, n := range names {
				before[n] = true
			}
		}
		s.mu.Lock()
		pending := false
		for _, n := range names {
			if p := stagedPath(n); before[n] && p != "" && !s.log.Listed(p) {
				if e, ok := s.stagedCache[n]; !ok || !s.log.SettledAll(e.Settled) {
					pending = true
				}
			}
		}
		s.mu.Unlock()
		if !pending {
			return nil
		}
		if err := s.sealListed(ctx, names); err != nil {
			return err
		}
	}
}
