package s3

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Group commit: the appends made at once through one Store (the shards a
// worker's flush has ready, one per policy version; the lanes of one
// ingest) share one record of the log instead of racing for one each.
// The first caller makes the record of every append queued when it
// starts; the others wait, and the next one queued leads the next record.
// A record of several entries is {"batch": [...]}; one of one entry is
// the entry itself, as before group commit, so that roots written by
// either read the same. Each entry is checked against the log before the
// record (ErrFenced fails that entry only); a claim has a record of its
// own, so that the entries after it are checked against it.

// appendReq is an append waiting for its record: its outcome comes on
// done; lead tells it to make the next record.
type appendReq struct {
	e    schemas.ShardEntry
	done chan error
	lead chan struct{}
}

// batchRecord is a manifest record that commits several entries.
type batchRecord struct {
	Batch []schemas.ShardEntry `json:"batch"`
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

// enqueue appends e with the appends queued with it.
func (s *Store) enqueue(ctx context.Context, e schemas.ShardEntry) error {
	req := &appendReq{e: e, done: make(chan error, 1), lead: make(chan struct{}, 1)}
	s.qmu.Lock()
	s.queue = append(s.queue, req)
	if !s.appending {
		s.appending = true
		req.lead <- struct{}{}
	}
	s.qmu.Unlock()
	for {
		select {
		case err := <-req.done:
			return err
		case <-req.lead:
			s.leadRecord(ctx)
		}
	}
}

// leadRecord makes one record of the appends queued (a claim alone, or
// every append up to the next claim), delivers their outcomes, and hands
// the lead to the next append queued, if any. A caller whose context
// ends stops waiting only once its entry's fate is known, as before group
// commit: an append that may have landed is never reported as not.
func (s *Store) leadRecord(ctx context.Context) {
	if s.cfg.Linger > 0 {
		t := time.NewTimer(s.cfg.Linger)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	s.qmu.Lock()
	n := 1
	if len(s.queue[0].e.Claims) == 0 {
		for n < len(s.queue) && len(s.queue[n].e.Claims) == 0 {
			n++
		}
	}
	batch := append([]*appendReq(nil), s.queue[:n]...)
	s.queue = s.queue[n:]
	s.qmu.Unlock()

	s.appendRecord(ctx, batch)

	s.qmu.Lock()
	if len(s.queue) > 0 {
		s.queue[0].lead <- struct{}{}
	} else {
		s.appending = false
	}
	s.qmu.Unlock()
}

// appendRecord appends the entries of reqs as one record and sends each
// its outcome.
func (s *Store) appendRecord(ctx context.Context, reqs []*appendReq) {
	finish := func(r *appendReq, err error) { r.done <- err }
	for attempt := 0; len(reqs) > 0; attempt++ {
		if attempt > 1000 {
			for _, r := range reqs {
				finish(r, fmt.Errorf("s3: manifest append: too much contention"))
			}
			return
		}
		s.mu.Lock()
		live := reqs[:0:0]
		for _, r := range reqs {
			if st := s.log.Fenced(&r.e, s.writer); st != "" {
				finish(r, fmt.Errorf("%w: %s", ErrFenced, st))
				continue
			}
			r.e.Seq = s.next
			live = append(live, r)
		}
		reqs = live
		if len(reqs) == 0 {
			s.mu.Unlock()
			return
		}
		seq := s.next
		entries := make([]schemas.ShardEntry, len(reqs))
		for i, r := range reqs {
			entries[i] = r.e
		}
		s.mu.Unlock()
		var data []byte
		var err error
		if len(entries) == 1 {
			data, err = json.Marshal(entries[0])
		} else {
			data, err = json.Marshal(batchRecord{Batch: entries})
		}
		if err != nil {
			for _, r := range reqs {
				finish(r, fmt.Errorf("s3: encode manifest entry: %w", err))
			}
			return
		}
		err = s.journal.Append(ctx, seq, data)
		switch {
		case err == nil:
			s.mu.Lock()
			if seq == s.next {
				s.applyRecord(entries)
			}
			s.mu.Unlock()
			s.maybeSnapshot(ctx, seq)
			for _, r := range reqs {
				finish(r, nil)
			}
			return
		case errors.Is(err, store.ErrStale):
			// Behind a compaction: reload. Entries that landed in time
			// are in the snapshot.
			s.mu.Lock()
			err := s.reload(ctx)
			if err == nil {
				err = s.loaded(ctx) // the entries may have been sealed since
			}
			live := reqs[:0:0]
			for _, r := range reqs {
				e := r.e
				landed := (e.Path != "" && s.log.Listed(e.Path)) || (e.DeadLetters != nil && s.log.Listed(e.DeadLetters.File))
				switch {
				case err != nil:
					finish(r, err)
				case landed:
					finish(r, nil)
				default:
					live = append(live, r)
				}
			}
			reqs = live
			s.mu.Unlock()
		case errors.Is(err, fs.ErrExist):
			if err := s.refresh(ctx); err != nil {
				for _, r := range reqs {
					finish(r, err)
				}
				return
			}
			if s.isOurs(ctx, seq, entries[0].Nonce) {
				for _, r := range reqs {
					finish(r, nil) // an earlier attempt landed; its answer was lost
				}
				return
			}
		default:
			for _, r := range reqs {
				finish(r, err)
			}
			return
		}
	}
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
