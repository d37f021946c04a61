package local

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unicode/utf8"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// DeadLetterLine is the JSON form of one dead letter.
type DeadLetterLine struct {
	Reason schemas.Reason `json:"reason"`
	Error  string         `json:"error"`
	Source schemas.Source `json:"source"`
	// Record is the original bytes: as text when they are valid UTF-8,
	// else base64 (std encoding) with RecordEncoding "base64".
	Record         string `json:"record"`
	RecordEncoding string `json:"record_encoding,omitempty"`
	// Truncated marks a too_large record of which only the first bytes are
	// kept; Size is its full length.
	Truncated bool  `json:"truncated,omitempty"`
	Size      int64 `json:"size,omitempty"`
}

// Encode returns the line form of d.
func Encode(d schemas.DeadLetter) DeadLetterLine {
	l := DeadLetterLine{Reason: d.Reason, Error: d.Error, Source: d.Source, Truncated: d.Truncated}
	if d.Truncated {
		l.Size = d.Size
	}
	if utf8.Valid(d.Record) {
		l.Record = string(d.Record)
	} else {
		l.Record = base64.StdEncoding.EncodeToString(d.Record)
		l.RecordEncoding = "base64"
	}
	return l
}

// DeadLetterFile appends dead letters as JSON lines to one file, created
// on the first dead letter. Counts are kept by reason. Safe for concurrent
// use.
type DeadLetterFile struct {
	path   string
	mu     sync.Mutex
	f      *os.File
	w      *bufio.Writer
	counts map[schemas.Reason]int64
}

// NewDeadLetterFile writes to path (its folder is created as needed).
func NewDeadLetterFile(path string) *DeadLetterFile {
	return &DeadLetterFile{path: path, counts: map[schemas.Reason]int64{}}
}

// DeadLetterPath is the default dead-letter file of a run under root.
func DeadLetterPath(root, runID string) string {
	return filepath.Join(root, DLQDir, runID+".jsonl")
}

// Write appends letters. It does not sync; Flush does.
func (d *DeadLetterFile) Write(ctx context.Context, letters []schemas.DeadLetter) error {
	if len(letters) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.f == nil {
		if err := os.MkdirAll(filepath.Dir(d.path), 0o755); err != nil {
			return fmt.Errorf("create dead-letter folder: %w", err)
		}
		f, err := os.OpenFile(d.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("open dead-letter file: %w", err)
		}
		d.f, d.w = f, bufio.NewWriterSize(f, 256<<10)
	}
	enc := json.NewEncoder(d.w)
	enc.SetEscapeHTML(false)
	for _, l := range letters {
		if err := enc.Encode(Encode(l)); err != nil {
			return fmt.Errorf("write dead letter: %w", err)
		}
		d.counts[l.Reason]++
	}
	return nil
}

// Flush writes buffered lines and syncs the file.
func (d *DeadLetterFile) Flush() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.f == nil {
		return nil
	}
	if err := d.w.Flush(); err != nil {
		return fmt.Errorf("flush dead letters: %w", err)
	}
	if err := d.f.Sync(); err != nil {
		return fmt.Errorf("sync dead letters: %w", err)
	}
	return nil
}

// Counts returns the dead letters written, by reason.
func (d *DeadLetterFile) Counts() map[schemas.Reason]int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[schemas.Reason]int64, len(d.counts))
	for k, v := range d.counts {
		out[k] = v
	}
	return out
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
