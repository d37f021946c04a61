package local

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// DeadLetterFile appends dead letters as JSON lines to one file, created
// on the first dead letter. Counts are kept by reason. Safe for concurrent
// use.
type DeadLetterFile struct {
	schemas.Ledger
	path    string
	name    string // in manifest entries
	mu      sync.Mutex
	f       *os.File
	w       *bufio.Writer
	written int64
	durable int64 // the length at the last checkpoint
	dirty   bool  // written since the last sync
	// committed, when set, is the length the manifest made durable (the
	// Store's entries that landed): Reset cuts back to it, not to the last
	// checkpoint, whose entry may not have landed.
	committed func() int64
	// checkpoints are the checkpoints not known committed: the file's
	// length after each and the letters it counted, which Reset takes
	// back out of the counts when it cuts them.
	checkpoints []dlqCheckpoint
}

type dlqCheckpoint struct {
	bytes  int64
	counts map[schemas.Reason]int64
}

var _ store.DeadLetters = (*DeadLetterFile)(nil)

// NewDeadLetterFile writes to path (its folder is created as needed);
// manifest entries name it name: its path relative to the output root
// when it lies under it (a writer's next run cuts what they did not make
// durable), else its absolute path.
func NewDeadLetterFile(path, name string) *DeadLetterFile {
	return &DeadLetterFile{path: path, name: name}
}

// Path is the file's path.
func (d *DeadLetterFile) Path() string { return d.path }

// Name is the file's path, for messages.
func (d *DeadLetterFile) Name() string { return d.path }

// Write appends letters and notes the positions of letters and dropped
// records as pending. It does not sync; Checkpoint does.
func (d *DeadLetterFile) Write(ctx context.Context, letters []schemas.DeadLetter, dropped []schemas.Source) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(letters) == 0 {
		d.Note(nil, dropped)
		return nil
	}
	if d.f == nil {
		if err := os.MkdirAll(filepath.Dir(d.path), 0o755); err != nil {
			return fmt.Errorf("create dead-letter folder: %w", err)
		}
		f, err := os.OpenFile(d.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("open dead-letter file: %w", err)
		}
		info, err := f.Stat()
		if err != nil {
			f.Close()
			return fmt.Errorf("open dead-letter file: %w", err)
		}
		d.f, d.w, d.written, d.durable = f, bufio.NewWriterSize(f, 256<<10), info.Size(), info.Size()
	}
	cw := countWriter{w: d.w}
	enc := json.NewEncoder(&cw)
	enc.SetEscapeHTML(false)
	for _, l := range letters {
		if err := enc.Encode(l.Line()); err != nil {
			return fmt.Errorf("write dead letter: %w", err)
		}
	}
	d.Note(letters, dropped)
	d.written += cw.n
	d.dirty = true
	return nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// Checkpoint makes every letter written so far durable and returns the
// positions settled since the last checkpoint, with the file's durable
// length (nil before the first letter). It is cheap when nothing is
// pending.
func (d *DeadLetterFile) Checkpoint(ctx context.Context) (schemas.Settled, *schemas.DeadLetterState, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dirty {
		if err := d.flush(); err != nil {
			return nil, nil, err
		}
		d.dirty = false
	}
	d.durable = d.written
	settled, counted := d.TakeCounts()
	if len(counted) > 0 {
		d.checkpoints = append(d.checkpoints, dlqCheckpoint{bytes: d.written, counts: counted})
	}
	if d.committed != nil { // those the manifest made durable cannot be cut
		c := d.committed()
		kept := d.checkpoints[:0]
		for _, cp := range d.checkpoints {
			if cp.bytes > c {
				kept = append(kept, cp)
			}
		}
		d.checkpoints = kept
	}
	if d.written == 0 {
		return settled, nil, nil
	}
	return settled, &schemas.DeadLetterState{File: d.name, Bytes: d.written}, nil
}

// Reset cuts the letters no manifest entry made durable: those written
// since the last checkpoint, and those of a checkpoint whose entry did not
// land (the generation ended between the two). Their records go to the
// stream's next owner, who dead-letters them again.
func (d *DeadLetterFile) Reset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.Drop()
	if d.committed != nil {
		d.durable = min(d.durable, d.committed())
	}
	// The letters of checkpoints beyond what stays are counted no more.
	kept := d.checkpoints[:0]
	for _, cp := range d.checkpoints {
		if cp.bytes > d.durable {
			d.Uncount(cp.counts)
		} else {
			kept = append(kept, cp)
		}
	}
	d.checkpoints = kept
	if d.f == nil || d.written == d.durable {
		return
	}
	d.w.Reset(d.f) // what the buffer holds is past the checkpoint
	if err := d.f.Truncate(d.durable); err == nil {
		d.written, d.dirty = d.durable, false
	}
}

// Flush writes buffered lines and syncs the file.
func (d *DeadLetterFile) Flush() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.flush()
}

func (d *DeadLetterFile) flush() error {
	if d.f == nil {
		return nil
	}
	if d.w.Buffered() > 0 {
		step("write dead letters")
	}
	if err := d.w.Flush(); err != nil {
		return fmt.Errorf("flush dead letters: %w", err)
	}
	if err := d.f.Sync(); err != nil {
		return fmt.Errorf("sync dead letters: %w", err)
	}
	return nil
}

// Close flushes and closes the file. It is safe to call twice.
func (d *DeadLetterFile) Close() error {
	err := d.Flush()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.f != nil {
		if cerr := d.f.Close(); err == nil {
			err = cerr
		}
		d.f = nil
	}
	return err
}
