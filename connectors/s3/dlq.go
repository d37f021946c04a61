package s3

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

var _ store.DeadLetters = (*DeadLetters)(nil)

// DeadLetters buffers dead letters and, at each checkpoint, uploads them
// as one create-only object that the settling manifest entry references.
type DeadLetters struct {
	schemas.Ledger
	s   *Store
	mu  sync.Mutex
	buf bytes.Buffer
}

// Name describes where the letters go.
func (d *DeadLetters) Name() string {
	return "s3://" + d.s.cfg.Bucket + "/" + d.s.key(store.DeadLetterDir+"/")
}

// Reset drops the letters not yet checkpointed: their records go to the
// stream's next owner.
func (d *DeadLetters) Reset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.buf.Reset()
	d.Drop()
}

// Close uploads nothing (Checkpoint does).
func (d *DeadLetters) Close() error { return nil }

// Write buffers letters and notes the positions of letters and dropped
// records as pending.
func (d *DeadLetters) Write(ctx context.Context, letters []schemas.DeadLetter, dropped []schemas.Source) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	enc := json.NewEncoder(&d.buf)
	enc.SetEscapeHTML(false)
	for _, l := range letters {
		if err := enc.Encode(l.Line()); err != nil {
			return fmt.Errorf("s3: encode dead letter: %w", err)
		}
	}
	d.Note(letters, dropped)
	return nil
}

// Checkpoint uploads the buffered letters (if any) and hands over the
// positions they, and the dropped records, settle.
func (d *DeadLetters) Checkpoint(ctx context.Context) (schemas.Settled, *schemas.DeadLetterState, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var state *schemas.DeadLetterState
	if d.buf.Len() > 0 {
		rel, err := d.s.PutDeadLetters(ctx, int(d.s.dlqSeq.Add(1)), d.buf.Bytes())
		if err != nil {
			return nil, nil, err
		}
		state = &schemas.DeadLetterState{File: rel, Bytes: int64(d.buf.Len())}
		d.buf.Reset()
	}
	return d.Take(), state, nil
}
