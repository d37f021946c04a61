package pipeline

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/rllm-pipe/rllm-pipe/connectors/sink"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// A spool keeps a local copy of an input that cannot be read again
// (stdin), line for line, until the fate of its records is committed:
// written in a committed shard, or dead-lettered, or dropped, by a
// manifest entry that settles them. When the run ends with records whose
// fate was never committed (a commit gave up during a store outage, a
// second signal), Spill writes their lines, as they were read, to the
// spill file, which a later `ingest --from` of that file writes: nothing
// read is ever lost.
//
// The copy is kept in segments of spoolSegment bytes beside the spill
// file; a segment whose records are all settled is deleted, so the disk a
// long stream takes is bounded by what is not committed yet.
type spool struct {
	spill  string // the final file of the unwritten lines
	stream string // the records' exactly-once stream, private to this run

	mu      sync.Mutex
	settled schemas.Ranges
	segs    []*segment // oldest first; the last one is written
	lines   int64      // lines numbered so far
	seq     int
	err     error // the first write error: the copy is then incomplete
	closed  bool
}

// segment is one file of the spool: lines first..last of the input,
// records of them non-blank.
type segment struct {
	path        string
	first, last int64
	records     int64
	f           *os.File
	w           *bufio.Writer
	size        int64
}

// spoolSegment is the size at which the spool starts a new segment.
var spoolSegment int64 = 64 << 20

// newSpool prepares a spool whose unwritten lines go to spill. It creates
// the first segment at once, so that a spill folder that cannot be
// written fails the run before anything is read.
func newSpool(spill, stream string) (*spool, error) {
	sp := &spool{spill: spill, stream: stream}
	if err := sp.rotate(); err != nil {
		return nil, err
	}
	return sp, nil
}

func (sp *spool) rotate() error {
	if n := len(sp.segs); n > 0 {
		if err := sp.segs[n-1].close(); err != nil {
			return err
		}
	}
	sp.seq++
	dir, base := filepath.Split(sp.spill)
	path := filepath.Join(dir, fmt.Sprintf(".%s.spool-%06d", base, sp.seq))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("spool of stdin (--spill): %w", err)
	}
	sp.segs = append(sp.segs, &segment{path: path, first: sp.lines + 1, last: sp.lines, f: f, w: bufio.NewWriterSize(f, 256<<10)})
	return nil
}

func (s *segment) close() error {
	if s.f == nil {
		return nil
	}
	err := s.w.Flush()
	err = errors.Join(err, s.f.Close())
	s.f = nil
	return err
}

// keep copies chunk c, read in order from the input, into the spool, and
// gives its records the spool's stream, so that their fates are settled
// in the commits. It numbers the lines as ingest.DecodeStage does.
func (sp *spool) keep(c *ingest.Chunk) {
	c.Split()
	sp.mu.Lock()
	defer sp.mu.Unlock()
	base := int64(0)
	if c.Lines > 0 {
		base = sp.lines
	}
	for i := range c.Records {
		r := &c.Records[i]
		r.Source.Stream = sp.stream
		if sp.closed || sp.err != nil {
			continue
		}
		sp.write(base+r.Source.Line, r.Data)
	}
	if c.Lines > 0 {
		sp.lines += c.Lines
	} else if n := len(c.Records); n > 0 {
		sp.lines = max(sp.lines, c.Records[n-1].Source.Line)
	}
	if sp.closed || sp.err != nil {
		return
	}
	seg := sp.segs[len(sp.segs)-1]
	if sp.lines > seg.last {
		// Trailing blank lines: numbered, so the next record's line is
		// where it belongs.
		sp.pad(seg, sp.lines)
	}
	if seg.size >= spoolSegment {
		if err := sp.rotate(); err != nil {
			sp.err = err
		}
	}
	sp.dropSettled()
}

// write appends line (1-based) of the input to the current segment, blank
// lines before it as empty lines.
func (sp *spool) write(line int64, data []byte) {
	seg := sp.segs[len(sp.segs)-1]
	if line <= seg.last {
		return // numbered already: never expected
	}
	sp.pad(seg, line-1)
	seg.w.Write(data)
	if err := seg.w.WriteByte('\n'); err != nil && sp.err == nil {
		sp.err = fmt.Errorf("spool of stdin: %w", err)
	}
	seg.size += int64(len(data)) + 1
	seg.last = line
	seg.records++
}

func (sp *spool) pad(seg *segment, upto int64) {
	for ; seg.last < upto; seg.last++ {
		seg.w.WriteByte('\n')
		seg.size++
	}
}

// settle notes positions a commit settled.
func (sp *spool) settle(s schemas.Settled) {
	r, ok := s[sp.stream]
	if !ok {
		return
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.settled.Union(r)
}

// dropSettled deletes the closed segments whose records are all settled.
func (sp *spool) dropSettled() {
	for len(sp.segs) > 1 && sp.segs[0].records == countIn(sp.settled, sp.segs[0].first, sp.segs[0].last) {
		_ = os.Remove(sp.segs[0].path)
		sp.segs = sp.segs[1:]
	}
}

// countIn is how many positions of r lie in [lo, hi].
func countIn(r schemas.Ranges, lo, hi int64) int64 {
	var n int64
	for _, iv := range r {
		a, b := max(iv[0], lo), min(iv[1], hi)
		if a <= b {
			n += b - a + 1
		}
	}
	return n
}

// finish ends the spool: it writes the lines of the records not settled
// to the spill file (none: no file) and deletes the segments. It returns
// how many lines it spilled. Reads that still come are not kept.
func (sp *spool) finish() (int64, error) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.closed = true
	var errs []error
	for _, seg := range sp.segs {
		errs = append(errs, seg.close())
	}
	defer func() {
		for _, seg := range sp.segs {
			_ = os.Remove(seg.path)
		}
		sp.segs = nil
	}()
	if err := errors.Join(errs...); err != nil {
		sp.err = errors.Join(sp.err, err)
	}
	var out *os.File
	var w *bufio.Writer
	var n int64
	for _, seg := range sp.segs {
		if seg.records == countIn(sp.settled, seg.first, seg.last) {
			continue
		}
		f, err := os.Open(seg.path)
		if err != nil {
			return n, fmt.Errorf("spool of stdin: %w", err)
		}
		r := bufio.NewReaderSize(f, 256<<10)
		for line := seg.first; line <= seg.last; line++ {
			data, err := r.ReadSlice('\n')
			for errors.Is(err, bufio.ErrBufferFull) {
				var more []byte
				more, err = r.ReadSlice('\n')
				data = append(append([]byte(nil), data...), more...)
			}
			if err != nil && !(errors.Is(err, io.EOF) && len(data) > 0) {
				f.Close()
				return n, fmt.Errorf("spool of stdin: line %d: %w", line, err)
			}
			if len(data) <= 1 || sp.settled.Contains(line) {
				continue
			}
			if out == nil {
				if out, err = os.OpenFile(sp.spill, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600); err != nil {
					f.Close()
					return n, fmt.Errorf("spill file: %w", err)
				}
				w = bufio.NewWriterSize(out, 256<<10)
			}
			w.Write(data)
			n++
		}
		f.Close()
	}
	if out != nil {
		err := w.Flush()
		err = errors.Join(err, out.Sync(), out.Close())
		if err != nil {
			return n, fmt.Errorf("spill file: %w", err)
		}
	}
	return n, sp.err
}

// spoolSource copies what its source reads into a spool.
type spoolSource struct {
	ingest.Source
	sp *spool
}

func (s spoolSource) Read(ctx context.Context) (ingest.Chunk, error) {
	c, err := s.Source.Read(ctx)
	s.sp.keep(&c)
	return c, err
}

// settleStore tells the spool what every commit settles.
type settleStore struct {
	sink.Store
	sp *spool
}

func (s settleStore) Create(ctx context.Context, rel string) (store.Pending, error) {
	p, err := s.Store.Create(ctx, rel)
	if err != nil {
		return nil, err
	}
	return settlePending{p, s.sp}, nil
}

func (s settleStore) Append(ctx context.Context, e schemas.ShardEntry) error {
	if err := s.Store.Append(ctx, e); err != nil {
		return err
	}
	s.sp.settle(e.Settled)
	return nil
}

type settlePending struct {
	store.Pending
	sp *spool
}

func (p settlePending) Commit(ctx context.Context, e schemas.ShardEntry) error {
	if err := p.Pending.Commit(ctx, e); err != nil {
		return err
	}
	p.sp.settle(e.Settled)
	return nil
}
