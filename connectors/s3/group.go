package s3

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Group commit: the appends made at once through one Store (the shards a
// worker's flush has ready, one per policy version; the lanes of one
// ingest) share one record of the log instead of racing for one each.
// The first caller makes the record of every append queued when it
// starts; the others wait, and the next one queued leads the next record.
// A record of one entry is the entry itself, as before group commit. A
// record of several is {"batch": [...], "seq": "batch"}: the string
// where a reader older than group commit expects the entry's number
// makes that reader fail on the record, instead of reading it as an
// empty entry and missing its shards (upgrade every reader and writer of
// a root before writing it with this version). Each entry is checked
// against the log before the record (ErrFenced fails that entry only); a
// claim has a record of its own, so that the entries after it are
// checked against it. A record lands whole or not at all.

// batchRecord is a manifest record that commits several entries.
type batchRecord struct {
	Batch []schemas.ShardEntry `json:"batch"`
	// Gate is "batch", a string under the key where an entry has its
	// number: see above.
	Gate string `json:"seq"`
}

// decodeRecord returns the entries of a manifest record: one entry, or a
// group commit's batch.
func decodeRecord(data []byte) ([]schemas.ShardEntry, error) {
	var probe struct {
		Batch json.RawMessage `json:"batch"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return nil, err
	}
	if probe.Batch == nil {
		var e schemas.ShardEntry
		if err := json.Unmarshal(data, &e); err != nil {
			return nil, err
		}
		return []schemas.ShardEntry{e}, nil
	}
	var b batchRecord
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, err
	}
	return b.Batch, nil
}

// enqueue appends e with the appends queued with it: a claim in a record
// of its own, other entries together up to the next claim. A caller whose
// context ends stops waiting only once its entry's fate is known, as
// before group commit: an append that may have landed is never reported
// as not.
func (s *Store) enqueue(ctx context.Context, e schemas.ShardEntry) error {
	take := func(q []*store.Waiter[schemas.ShardEntry]) int {
		if len(q[0].Item.Claims) > 0 {
			return 1
		}
		n := 1
		for n < len(q) && len(q[n].Item.Claims) == 0 {
			n++
		}
		return n
	}
	return s.queue.Do(ctx, e, take, func(ctx context.Context, batch []*store.Waiter[schemas.ShardEntry]) func() {
		seq, ok := s.appendRecord(ctx, batch)
		if !ok {
			return nil
		}
		return func() { s.maybeSnapshot(ctx, seq) } // after the hand-off: the next record need not wait
	})
}

// appendRecord appends the entries of reqs as one record and sends each
// its outcome; it returns the record's number when this call made it.
func (s *Store) appendRecord(ctx context.Context, reqs []*store.Waiter[schemas.ShardEntry]) (int64, bool) {
	finish := func(r *store.Waiter[schemas.ShardEntry], err error) { r.Finish(err) }
	for attempt := 0; len(reqs) > 0; attempt++ {
		if attempt > 1000 {
			for _, r := range reqs {
				finish(r, fmt.Errorf("s3: manifest append: too much contention"))
			}
			return 0, false
		}
		s.mu.Lock()
		live := reqs[:0:0]
		for _, r := range reqs {
			if st := s.log.Fenced(&r.Item, s.writer); st != "" {
				finish(r, fmt.Errorf("%w: %s", ErrFenced, st))
				continue
			}
			r.Item.Seq = s.next
			live = append(live, r)
		}
		reqs = live
		if len(reqs) == 0 {
			s.mu.Unlock()
			return 0, false
		}
		seq := s.next
		entries := make([]schemas.ShardEntry, len(reqs))
		for i, r := range reqs {
			entries[i] = r.Item
		}
		s.mu.Unlock()
		var data []byte
		var err error
		if len(entries) == 1 {
			data, err = json.Marshal(entries[0])
		} else {
			data, err = json.Marshal(batchRecord{Batch: entries, Gate: "batch"})
		}
		if err != nil {
			for _, r := range reqs {
				finish(r, fmt.Errorf("s3: encode manifest entry: %w", err))
			}
			return 0, false
		}
		err = s.journal.Append(ctx, seq, data)
		switch {
		case err == nil:
			s.mu.Lock()
			if seq == s.next {
				s.applyRecord(entries)
			}
			s.mu.Unlock()
			for _, r := range reqs {
				finish(r, nil)
			}
			return seq, true
		case errors.Is(err, store.ErrStale):
			// Behind a compaction: reload. A record that landed in time
			// is in the snapshot, whole.
			s.mu.Lock()
			err := s.reload(ctx)
			if err == nil {
				err = s.loaded(ctx) // the entries may have been sealed since
			}
			landed := err == nil && s.recordLanded(seq, entries)
			s.mu.Unlock()
			if err != nil || landed {
				for _, r := range reqs {
					finish(r, err)
				}
				return 0, false
			}
		case errors.Is(err, fs.ErrExist):
			if err := s.refresh(ctx); err != nil {
				for _, r := range reqs {
					finish(r, err)
				}
				return 0, false
			}
			if s.isOurs(ctx, seq, entries) {
				for _, r := range reqs {
					finish(r, nil) // an earlier attempt landed; its answer was lost
				}
				return 0, false
			}
		default:
			for _, r := range reqs {
				finish(r, err)
			}
			return 0, false
		}
	}
	return 0, false
}

// recordLanded reports whether the record of entries, appended at seq,
// is in the log: one of its entries carries its nonce there, or lists a
// shard (a record lands whole, and a snapshot keeps the entries that list
// a shard or dead letters, not the others); a record of dead-letter
// marks alone is judged by its first file being listed, as before group
// commit. Callers hold mu.
func (s *Store) recordLanded(seq int64, entries []schemas.ShardEntry) bool {
	for _, e := range entries {
		if s.log.HasNonce(seq, e.Nonce) || (e.Path != "" && s.log.Listed(e.Path)) {
			return true
		}
	}
	e := entries[0]
	return e.DeadLetters != nil && s.log.Listed(e.DeadLetters.File) && len(entries) == 1
}

// applyRecord applies a record's entries, the next record's. Callers
// hold mu.
func (s *Store) applyRecord(entries []schemas.ShardEntry) {
	for _, e := range entries {
		e.Seq = s.next
		s.log.Apply(e)
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
