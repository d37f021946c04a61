package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	kgo "github.com/segmentio/kafka-go"

	"github.com/rllm-pipe/rllm-pipe/ingest"
)

// partitionRecords reads records of one partition again by offset: the
// source hands every record on with a reference to it (ingest.RawRef),
// so that the assembler holds no record's bytes while its group is open,
// and the few records that end as dead letters are fetched once more.
type partitionRecords struct {
	c *Consumer
	p int
}

// rereadBytes is what one fetch of Reread asks for at least: the records
// of a group's dead letters lie close together, and one fetch reads many.
const rereadBytes = 1 << 20

// Reread fetches the records at refs' offsets, as few fetches as their
// spread allows. An offset the partition no longer holds (retention,
// compaction) gets its reason in errs; a failed connection is retried,
// with backoff, until ctx ends.
func (r *partitionRecords) Reread(ctx context.Context, refs []ingest.RawRef) ([][]byte, []error, error) {
	recs, errs := make([][]byte, len(refs)), make([]error, len(refs))
	at := map[int64][]int{} // offset → its refs
	var offs []int64
	for i, ref := range refs {
		if at[ref.Off] == nil {
			offs = append(offs, ref.Off)
		}
		at[ref.Off] = append(at[ref.Off], i)
	}
	slices.Sort(offs)
	gone := func(off int64, err error) {
		for _, i := range at[off] {
			errs[i] = err
		}
	}
	stream := Stream(r.c.cfg.Topic, r.p)
	backoff := 100 * time.Millisecond
	for len(offs) > 0 {
		rest, err := r.fetch(ctx, offs, func(off int64, value []byte) {
			for _, i := range at[off] {
				if len(value) != refs[i].Len {
					errs[i] = fmt.Errorf("%s offset %d now holds %d bytes, not the %d read before", stream, off, len(value), refs[i].Len)
					continue
				}
				recs[i] = value
			}
		}, gone)
		if len(rest) < len(offs) {
			backoff = 100 * time.Millisecond
		} else if err == nil {
			err = errors.New("the fetch returned none of the records")
		}
		offs = rest
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		slog.Warn("kafka: reading records again for dead letters, retrying", "stream", stream, "offset", offs[0], "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	return recs, errs, nil
}

// fetch reads one batch of about rereadBytes (the broker sends a larger
// first record whole) from offs[0] on and hands each wanted record to
// got; offsets the batch passes over without holding them go to gone.
// It returns the offsets still to read, with an error when the fetch
// failed before it was done with them.
func (r *partitionRecords) fetch(ctx context.Context, offs []int64, got func(int64, []byte), gone func(int64, error)) ([]int64, error) {
	stream := Stream(r.c.cfg.Topic, r.p)
	conn, err := r.c.dialLeader(ctx, r.c.dialer, r.p)
	if err != nil {
		return offs, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	first, last, err := conn.ReadOffsets()
	if err != nil {
		return offs, fmt.Errorf("kafka: offsets of %s: %w", stream, err)
	}
	for len(offs) > 0 && (offs[0] < first || offs[0] >= last) {
		gone(offs[0], fmt.Errorf("%s no longer holds offset %d (it holds %d to %d: retention or truncation)", stream, offs[0], first, last-1))
		offs = offs[1:]
	}
	if len(offs) == 0 {
		return nil, nil
	}
	if _, err := conn.Seek(offs[0], kgo.SeekAbsolute|kgo.SeekDontCheck); err != nil {
		return offs, fmt.Errorf("kafka: seek %s to %d: %w", stream, offs[0], err)
	}
	batch := conn.ReadBatchWith(kgo.ReadBatchConfig{MinBytes: 1, MaxBytes: rereadBytes, MaxWait: fetchWait})
	for len(offs) > 0 {
		m, err := batch.ReadMessage()
		if err != nil {
			break // io.EOF at the end of the batch; other errors come from Close
		}
		for len(offs) > 0 && offs[0] < m.Offset {
			gone(offs[0], fmt.Errorf("%s no longer holds offset %d (compacted away)", stream, offs[0]))
			offs = offs[1:]
		}
		if len(offs) > 0 && offs[0] == m.Offset {
			got(m.Offset, m.Value)
			offs = offs[1:]
		}
	}
	if err := batch.Close(); err != nil && !errors.Is(err, kgo.RequestTimedOut) {
		return offs, fmt.Errorf("kafka: read %s: %w", stream, err)
	}
	return offs, nil
}
