package recordlog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/rllm-pipe/rllm-pipe/ingest"
)

// Errors a Write or Open may wrap.
var (
	// ErrClosed: the log was closed; nothing was written.
	ErrClosed = errors.New("recordlog: closed")
	// ErrLocked: another process has the log open.
	ErrLocked = errors.New("recordlog: held by another process")
	// ErrRecord: a record that cannot be one line of the log (empty,
	// blank, with a line break, or larger than MaxRecordBytes).
	ErrRecord = errors.New("recordlog: bad record")
)

// RecordError is a Write's refusal of one of its records (errors.Is
// ErrRecord): Index is its place in the Write's lines, Reason why
// (too_large, line_break, blank). Nothing of that Write was written.
type RecordError struct {
	Index  int
	Reason string
	Detail string
}

func (e *RecordError) Error() string {
	return fmt.Sprintf("%v: record %d: %s", ErrRecord, e.Index, e.Detail)
}

func (e *RecordError) Unwrap() error { return ErrRecord }

// Defaults of Options.
const (
	DefaultMaxBatchBytes = 8 << 20
	DefaultQueue         = 1024
)

// Options tune a Log; the zero value is one file, never rotated.
type Options struct {
	// MaxFileBytes rotates to a new numbered segment once a write would
	// take the current one past it (0: one file at the log's path, never
	// rotated). A single batch larger than it makes a larger segment.
	MaxFileBytes int64
	// MaxRecordBytes refuses longer records (default
	// ingest.DefaultMaxRecordBytes, what ingest accepts).
	MaxRecordBytes int
	// MaxBatchBytes bounds one group commit (default 8 MiB); one Write
	// larger than it is committed alone.
	MaxBatchBytes int
	// Queue is how many Writes may wait for the committer (default 1024);
	// more block until it catches up, or until their ctx ends.
	Queue int
}

// Segment is one file of the log.
type Segment struct {
	// N numbers the segment (0 for the one file of a log that does not
	// rotate; 1, 2, ... otherwise).
	N    int
	Path string
	// Stream is the segment's exactly-once identity (from its header's
	// nonce): the same file is the same stream wherever it is moved.
	Stream string
}

// Position is a place in the log: a byte offset in a segment.
type Position struct {
	Segment int
	Size    int64
}

// Log is an append-only record log. Write is safe for concurrent use.
type Log struct {
	path string
	o    Options
	lk   *os.File

	mu     sync.RWMutex // guards closed against sends on reqs
	closed bool
	reqs   chan *request
	done   chan struct{}
	once   sync.Once
	cerr   error

	// Owned by the committer goroutine.
	f      *os.File
	cur    Segment
	size   int64
	broken error
	buf    []byte
	// commits counts group commits (one write and fsync each).
	commits atomic.Int64

	smu     sync.Mutex // what readers see
	segs    []Segment
	durable Position
	changed chan struct{}
}

type request struct {
	ctx   context.Context
	lines [][]byte
	size  int
	done  chan error
}

// Open opens (or creates) the log at path and takes its lock (path +
// ".lock"). On an existing log it cuts a torn last line (a crash during a
// write that was never acknowledged) and appends after the last whole
// one. A file at path that the log did not create is refused.
func Open(path string, o Options) (*Log, error) {
	if o.MaxRecordBytes <= 0 {
		o.MaxRecordBytes = ingest.DefaultMaxRecordBytes
	}
	if o.MaxBatchBytes <= 0 {
		o.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if o.Queue <= 0 {
		o.Queue = DefaultQueue
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("recordlog: %w", err)
		}
	}
	lk, err := lock(path + ".lock")
	if err != nil {
		return nil, fmt.Errorf("recordlog: %w", err)
	}
	l := &Log{path: path, o: o, lk: lk, reqs: make(chan *request, o.Queue), done: make(chan struct{}), changed: make(chan struct{})}
	if err := l.open(); err != nil {
		lk.Close()
		return nil, fmt.Errorf("recordlog: open %s: %w", path, err)
	}
	go l.run()
	return l, nil
}

// segmentPath names segment n: the path itself for a log that does not
// rotate, else wal.jsonl → wal.00000001.jsonl.
func (l *Log) segmentPath(n int) string {
	if l.o.MaxFileBytes <= 0 {
		return l.path
	}
	ext := filepath.Ext(l.path)
	return fmt.Sprintf("%s.%08d%s", strings.TrimSuffix(l.path, ext), n, ext)
}

// list returns the numbers of the segments on disk, ascending.
func (l *Log) list() ([]int, error) {
	if l.o.MaxFileBytes <= 0 {
		if _, err := os.Stat(l.path); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, nil
			}
			return nil, err
		}
		return []int{0}, nil
	}
	ext := filepath.Ext(l.path)
	prefix := filepath.Base(strings.TrimSuffix(l.path, ext)) + "."
	ents, err := os.ReadDir(filepath.Dir(l.path))
	if err != nil {
		return nil, err
	}
	var ns []int
	for _, e := range ents {
		name := e.Name()
		mid, ok := strings.CutPrefix(name, prefix)
		if !ok || !strings.HasSuffix(mid, ext) || !e.Type().IsRegular() {
			continue
		}
		mid = strings.TrimSuffix(mid, ext)
		if n, err := strconv.Atoi(mid); err == nil && n > 0 && len(mid) == 8 {
			ns = append(ns, n)
		}
	}
	slices.Sort(ns)
	return ns, nil
}

func (l *Log) open() error {
	ns, err := l.list()
	if err != nil {
		return err
	}
	if len(ns) == 0 {
		first := 1
		if l.o.MaxFileBytes <= 0 {
			first = 0
		}
		return l.create(first)
	}
	for _, n := range ns[:len(ns)-1] {
		seg, err := l.readSegment(n)
		if err != nil {
			return err
		}
		l.segs = append(l.segs, seg)
	}
	return l.reopen(ns[len(ns)-1])
}

// readSegment reads a sealed segment's identity.
func (l *Log) readSegment(n int) (Segment, error) {
	p := l.segmentPath(n)
	f, err := os.Open(p)
	if err != nil {
		return Segment{}, err
	}
	defer f.Close()
	stream, err := readHeader(f)
	if err != nil {
		return Segment{}, fmt.Errorf("%s: %w", p, err)
	}
	return Segment{N: n, Path: p, Stream: stream}, nil
}

// reopen opens the last segment for appending, cutting a torn last line.
func (l *Log) reopen(n int) error {
	p := l.segmentPath(n)
	f, err := os.OpenFile(p, os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	if st.Size() == 0 {
		// Created empty by someone else (touch): make it a log.
		f.Close()
		return l.create(n)
	}
	stream, err := readHeader(f)
	if err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", p, err)
	}
	end, err := lastLineEnd(f, st.Size())
	if err != nil {
		f.Close()
		return err
	}
	if end != st.Size() {
		if err := f.Truncate(end); err != nil {
			f.Close()
			return fmt.Errorf("cut the torn last line: %w", err)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return fmt.Errorf("cut the torn last line: %w", err)
		}
	}
	l.f, l.size = f, end
	l.cur = Segment{N: n, Path: p, Stream: stream}
	l.segs = append(l.segs, l.cur)
	l.durable = Position{Segment: n, Size: end}
	return nil
}

// lastLineEnd is the offset just past the last newline of f (at least
// the header's end).
func lastLineEnd(f *os.File, size int64) (int64, error) {
	const block = 64 << 10
	buf := make([]byte, block)
	for hi := size; hi > HeaderSize; {
		lo := max(hi-block, HeaderSize-1)
		b := buf[:hi-lo]
		if _, err := f.ReadAt(b, lo); err != nil {
			return 0, fmt.Errorf("find the last line: %w", err)
		}
		if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
			return lo + int64(i) + 1, nil
		}
		hi = lo
	}
	return HeaderSize, nil
}

// create makes segment n, header written and fsynced before its name
// appears (temp file, rename, directory fsync), and makes it current.
func (l *Log) create(n int) error {
	p := l.segmentPath(n)
	tmp := p + ".tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	h := newHeader()
	if _, err := f.Write(h); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("write header: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("fsync header: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := syncDir(filepath.Dir(p)); err != nil {
		f.Close()
		return err
	}
	stream, err := readHeader(f)
	if err != nil {
		f.Close()
		return err
	}
	if l.f != nil {
		l.f.Close() // sealed: every write to it was fsynced
	}
	l.f, l.size = f, HeaderSize
	l.cur = Segment{N: n, Path: p, Stream: stream}
	l.publish(func() { l.segs = append(l.segs, l.cur) }, Position{Segment: n, Size: HeaderSize})
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}

// publish updates what readers see and wakes them.
func (l *Log) publish(update func(), p Position) {
	l.smu.Lock()
	defer l.smu.Unlock()
	if update != nil {
		update()
	}
	l.durable = p
	close(l.changed)
	l.changed = make(chan struct{})
}

// Path is the path the log was opened at.
func (l *Log) Path() string { return l.path }

// Durable returns the end of what is fsynced, and a channel closed when
// it moves.
func (l *Log) Durable() (Position, <-chan struct{}) {
	l.smu.Lock()
	defer l.smu.Unlock()
	return l.durable, l.changed
}

// Segments returns the log's segments, oldest first; the last is the one
// written to.
func (l *Log) Segments() []Segment {
	l.smu.Lock()
	defer l.smu.Unlock()
	return slices.Clone(l.segs)
}

// Remove deletes sealed segment n (never the one written to). The caller
// knows every record in it is settled downstream.
func (l *Log) Remove(n int) error {
	l.smu.Lock()
	i := slices.IndexFunc(l.segs, func(s Segment) bool { return s.N == n })
	if i < 0 || i == len(l.segs)-1 {
		l.smu.Unlock()
		return fmt.Errorf("recordlog: remove segment %d: not a sealed segment", n)
	}
	seg := l.segs[i]
	l.segs = slices.Delete(l.segs, i, i+1)
	l.smu.Unlock()
	if err := os.Remove(seg.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("recordlog: remove %s: %w", seg.Path, err)
	}
	return syncDir(filepath.Dir(seg.Path))
}

// Write appends lines (one wire record each, without line breaks) and
// returns once they are fsynced, together with the lines of every Write
// that arrived meanwhile (one write and one fsync for all). It blocks
// while Queue Writes wait, and returns early with ctx's error when ctx
// ends; an error means the lines may not be counted as written (a write
// that fails is cut back; one whose ctx ended after it was queued may
// still be written). Write does not keep lines.
func (l *Log) Write(ctx context.Context, lines [][]byte) error {
	size := 0
	for i, ln := range lines {
		if reason, detail := l.check(ln); reason != "" {
			return &RecordError{Index: i, Reason: reason, Detail: detail}
		}
		size += len(ln) + 1
	}
	if len(lines) == 0 {
		return nil
	}
	r := &request{ctx: ctx, lines: lines, size: size, done: make(chan error, 1)}
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return ErrClosed
	}
	select {
	case l.reqs <- r:
	case <-ctx.Done():
		l.mu.RUnlock()
		return fmt.Errorf("recordlog: write: %w", ctx.Err())
	}
	l.mu.RUnlock()
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("recordlog: write: %w", ctx.Err())
	}
}

// check returns why ln cannot be a line of the log ("" when it can).
func (l *Log) check(ln []byte) (reason, detail string) {
	switch {
	case len(ln) > l.o.MaxRecordBytes:
		return "too_large", fmt.Sprintf("%d bytes, more than %d", len(ln), l.o.MaxRecordBytes)
	case bytes.IndexByte(ln, '\n') >= 0 || bytes.IndexByte(ln, '\r') >= 0:
		return "line_break", "contains a line break"
	}
	for _, c := range ln {
		if c != ' ' && c != '\t' {
			return "", ""
		}
	}
	return "blank", "blank"
}

// run is the committer: it takes the waiting Writes, as many as fit in a
// batch, and commits them together.
func (l *Log) run() {
	defer close(l.done)
	var batch []*request
	for r := range l.reqs {
		batch = append(batch[:0], r)
		size := r.size
	more:
		for size < l.o.MaxBatchBytes {
			select {
			case r, ok := <-l.reqs:
				if !ok {
					break more
				}
				batch = append(batch, r)
				size += r.size
			default:
				break more
			}
		}
		l.commit(batch)
		clear(batch)
	}
}

func (l *Log) commit(batch []*request) {
	live := batch[:0]
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.done <- fmt.Errorf("recordlog: write: %w", err)
			continue
		}
		live = append(live, r)
	}
	if len(live) == 0 {
		return
	}
	err := l.append(live)
	for _, r := range live {
		r.done <- err
	}
}

// append writes and fsyncs the batch's lines at the end of the current
// segment, rotating first when they would take it past MaxFileBytes.
func (l *Log) append(batch []*request) error {
	if l.broken != nil {
		return l.broken
	}
	buf := l.buf[:0]
	for _, r := range batch {
		for _, ln := range r.lines {
			buf = append(buf, ln...)
			buf = append(buf, '\n')
		}
	}
	if cap(buf) <= 2*l.o.MaxBatchBytes {
		l.buf = buf
	}
	if l.o.MaxFileBytes > 0 && l.size > HeaderSize && l.size+int64(len(buf)) > l.o.MaxFileBytes {
		if err := l.create(l.cur.N + 1); err != nil {
			return fmt.Errorf("recordlog: rotate %s: %w", l.path, err)
		}
	}
	if _, err := l.f.WriteAt(buf, l.size); err != nil {
		// Cut what was written of the batch, so that the file ends with a
		// whole line and the next batch does not follow half a record.
		if terr := l.f.Truncate(l.size); terr != nil {
			l.broken = fmt.Errorf("recordlog: %s is broken (write failed: %v; cutting it back failed: %v): reopen it", l.cur.Path, err, terr)
			return l.broken
		}
		return fmt.Errorf("recordlog: write %s: %w", l.cur.Path, err)
	}
	if err := l.f.Sync(); err != nil {
		// After a failed fsync the kernel may have dropped the pages:
		// nothing later can be trusted until a reopen checks the file.
		l.broken = fmt.Errorf("recordlog: %s is broken (fsync failed: %w): reopen it", l.cur.Path, err)
		return l.broken
	}
	l.size += int64(len(buf))
	l.commits.Add(1)
	l.publish(nil, Position{Segment: l.cur.N, Size: l.size})
	return nil
}

// Close waits for the Writes already queued, then closes the file and
// releases the lock; later Writes fail with ErrClosed. Safe to call twice.
func (l *Log) Close() error {
	l.once.Do(func() {
		l.mu.Lock()
		l.closed = true
		close(l.reqs)
		l.mu.Unlock()
		<-l.done
		l.cerr = errors.Join(l.f.Close(), l.lk.Close())
	})
	return l.cerr
}

// Commits is how many group commits (one write and one fsync each) the
// log made since it was opened.
func (l *Log) Commits() int64 { return l.commits.Load() }
