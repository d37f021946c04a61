package recordlog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// chunkBytes is about how much a Tail hands out per Read.
const chunkBytes = 1 << 20

// Tail reads a log as it grows, from its oldest segment: an ingest.Source
// whose Read hands out the records up to the durable end, then waits for
// more until its ctx ends (it never returns io.EOF). A record's position
// is its segment's stream and its line in that file (the header's blank
// lines counted), the numbering `ingest --from` gives the same file.
type Tail struct {
	l         *Log
	onSegment func(context.Context, Segment) error

	rmu    sync.Mutex // held by Read except while it waits; Close takes it
	closed bool
	next   int // the segment to open next
	seg    Segment
	f      *os.File
	off    int64
	line   int64

	mu     sync.Mutex
	pos    Position
	passed []Passed
}

// Passed is a sealed segment a Tail read to its end.
type Passed struct {
	Segment
	// Last is the segment's last line; its records are lines
	// HeaderLines+1 to Last.
	Last int64
}

// Tail returns a reader of l from its oldest segment. onSegment, if not
// nil, is called (on the reading goroutine) before the first record of
// each segment is handed out; its error ends the Read.
func (l *Log) Tail(onSegment func(context.Context, Segment) error) *Tail {
	return &Tail{l: l, onSegment: onSegment}
}

// Read implements ingest.Source. It may be called while Close runs
// (a stage abandoning a blocked read): it then fails.
func (t *Tail) Read(ctx context.Context) (ingest.Chunk, error) {
	t.rmu.Lock()
	defer t.rmu.Unlock()
	for {
		if err := ctx.Err(); err != nil {
			return ingest.Chunk{}, err
		}
		if t.closed {
			return ingest.Chunk{}, errors.New("recordlog: tail: read after close")
		}
		if t.f == nil {
			opened, err := t.open(ctx)
			if err != nil {
				return ingest.Chunk{}, err
			}
			if !opened {
				continue
			}
		}
		pos, changed := t.l.Durable()
		var end int64
		switch {
		case pos.Segment == t.seg.N:
			end = pos.Size
		case pos.Segment > t.seg.N: // sealed: its size is final
			st, err := t.f.Stat()
			if err != nil {
				return ingest.Chunk{}, fmt.Errorf("recordlog: tail %s: %w", t.seg.Path, err)
			}
			end = st.Size()
		}
		if t.off < end {
			return t.chunk(end)
		}
		if pos.Segment > t.seg.N {
			t.mu.Lock()
			t.passed = append(t.passed, Passed{Segment: t.seg, Last: t.line})
			t.mu.Unlock()
			t.f.Close()
			t.f, t.next = nil, t.seg.N+1
			continue
		}
		t.rmu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
		}
		t.rmu.Lock()
	}
}

// open opens the first segment numbered next or later; false when there
// is none yet (the caller waits).
func (t *Tail) open(ctx context.Context) (bool, error) {
	var seg Segment
	found := false
	for _, s := range t.l.Segments() {
		if s.N >= t.next {
			seg, found = s, true
			break
		}
	}
	if !found {
		_, changed := t.l.Durable()
		t.rmu.Unlock()
		defer t.rmu.Lock()
		select {
		case <-changed:
			return false, nil
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	f, err := os.Open(seg.Path)
	if err != nil {
		return false, fmt.Errorf("recordlog: tail: %w", err)
	}
	if t.onSegment != nil {
		if err := t.onSegment(ctx, seg); err != nil {
			f.Close()
			return false, err
		}
	}
	t.seg, t.f, t.off, t.line = seg, f, HeaderSize, HeaderLines
	t.mu.Lock()
	t.pos = Position{Segment: seg.N, Size: HeaderSize}
	t.mu.Unlock()
	return true, nil
}

// chunk reads about chunkBytes of whole lines before end.
func (t *Tail) chunk(end int64) (ingest.Chunk, error) {
	want := min(end-t.off, chunkBytes)
	var buf []byte
	for {
		buf = make([]byte, want)
		if _, err := t.f.ReadAt(buf, t.off); err != nil {
			return ingest.Chunk{}, fmt.Errorf("recordlog: tail %s at byte %d: %w", t.seg.Path, t.off, err)
		}
		if i := bytes.LastIndexByte(buf, '\n'); i >= 0 {
			buf = buf[:i+1]
			break
		}
		if want == end-t.off {
			return ingest.Chunk{}, fmt.Errorf("recordlog: tail %s at byte %d: no line end before the durable end %d", t.seg.Path, t.off, end)
		}
		want = min(end-t.off, 2*want)
	}
	var c ingest.Chunk
	for data := buf; len(data) > 0; {
		nl := bytes.IndexByte(data, '\n')
		ln := data[:nl:nl]
		data = data[nl+1:]
		t.line++
		if len(bytes.TrimSpace(ln)) == 0 {
			c.Blank++
			continue
		}
		c.Records = append(c.Records, ingest.Raw{
			Data:   ln,
			Source: schemas.Source{Stream: t.seg.Stream, File: t.seg.Path, Line: t.line},
			Size:   int64(len(ln)),
		})
	}
	t.off += int64(len(buf))
	t.mu.Lock()
	t.pos = Position{Segment: t.seg.N, Size: t.off}
	t.mu.Unlock()
	return c, nil
}

// Position is how far Read has handed records out. Safe from any
// goroutine.
func (t *Tail) Position() Position {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pos
}

// Passed returns the sealed segments read to their end so far and
// forgets them. Safe from any goroutine.
func (t *Tail) Passed() []Passed {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.passed
	t.passed = nil
	return p
}

// Close closes the segment being read; a Read after it fails. Safe to
// call twice, and while a Read waits.
func (t *Tail) Close() error {
	t.rmu.Lock()
	defer t.rmu.Unlock()
	t.closed = true
	if t.f == nil {
		return nil
	}
	f := t.f
	t.f = nil
	return f.Close()
}

// Settled reports whether every record of a passed segment is in
// settled (a segment without records is).
func (p Passed) Settled(settled schemas.Settled) bool {
	if p.Last <= HeaderLines {
		return true
	}
	r := settled[p.Stream]
	lo, hi := HeaderLines+1, p.Last
	for _, iv := range r {
		if iv[0] <= lo && iv[1] >= hi {
			return true
		}
	}
	return false
}
