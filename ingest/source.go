package ingest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Raw is one undecoded record and where it came from.
type Raw struct {
	Data   []byte
	Source schemas.Source
	// Ref, when valid, locates Data in an input that can be read again
	// (see Rereader).
	Ref RawRef
	// Truncated is set when the record was larger than the source's limit;
	// Data then holds only its first bytes and Size the full length.
	Truncated bool
	Size      int64
}

// Chunk is a run of consecutive raw records. Its Data slices are owned by
// the chunk and stay valid until the chunk is dropped or released, or its
// source closed.
type Chunk struct {
	Records []Raw
	// Blank counts whitespace-only lines skipped while reading the chunk.
	Blank int64
	// Lines, when not zero, is how many lines (blank ones included) the
	// chunk covers, and its records' Source.Line counts from the chunk's
	// first line: a lineNumbering, fed the chunks in order, makes them the
	// input's line numbers. (A line source cannot number a chunk's lines
	// before the lines of every chunk ahead of it were split.)
	Lines int64
	// Release, if set, hands the chunk's memory back to its source for
	// reuse; the caller calls it once no Data slice is used any more.
	Release func()
	// whole, when set, holds the chunk's lines not yet split into Records;
	// Split does that.
	whole *lineRun
}

// Split fills in Records, Blank and Lines of a chunk whose source handed
// its lines over whole. A mapped file does that, so that the lines are
// split on the goroutine about to decode them, while their bytes are in
// its cache, instead of being read from memory once more by the reader.
// Split is idempotent; any other chunk is left as it is.
func (c *Chunk) Split() {
	if r := c.whole; r != nil {
		c.whole = nil
		r.split(c)
	}
}

// lineNumbering turns the chunk-relative line numbers of a stream's
// chunks (see Chunk.Lines), taken in source order, into its line
// numbers.
type lineNumbering struct{ base int64 }

// number renumbers one chunk's records; line returns each one's Source.
func (n *lineNumbering) number(lines int64, count int, line func(i int) *schemas.Source) {
	if lines == 0 {
		return
	}
	for i := range count {
		line(i).Line += n.base
	}
	n.base += lines
}

// Source yields raw records in order. Read blocks until at least one record
// is available, the input ends (io.EOF) or ctx is done. A Source is used
// by one goroutine.
type Source interface {
	Read(ctx context.Context) (Chunk, error)
	Close() error
}

// A Rereader reads records of its input again. Sources whose records can
// be read again set a RawRef on each record, so that whoever keeps a
// record for later (the assembler, for a dead letter it may never need)
// keeps the reference instead of the bytes.
type Rereader interface {
	// Reread returns the records refs point to (every ref's From is this
	// Rereader), in refs' order. A record that cannot be read again (the
	// input changed, the broker no longer holds it) gets a nil record and
	// its reason in errs; err is set only when nothing more can be read
	// (ctx ended).
	Reread(ctx context.Context, refs []RawRef) (recs [][]byte, errs []error, err error)
}

// RawRef is where a record lies in its input: a byte offset in a file, an
// offset in a Kafka partition.
type RawRef struct {
	From Rereader
	Off  int64
	Len  int
}

// Valid reports whether r refers to a record.
func (r RawRef) Valid() bool { return r.From != nil }

// RawFile is an input file that records can be read from again.
type RawFile struct {
	name string
	f    *os.File
}

// Reread reads the lines again. A line fails once the source is closed,
// or if the file no longer holds a whole line there.
func (rf *RawFile) Reread(ctx context.Context, refs []RawRef) ([][]byte, []error, error) {
	recs, errs := make([][]byte, len(refs)), make([]error, len(refs))
	for i, r := range refs {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		recs[i], errs[i] = rf.line(r.Off, r.Len)
	}
	return recs, errs, nil
}

func (rf *RawFile) line(off int64, n int) ([]byte, error) {
	b := make([]byte, n+1)
	got, err := rf.f.ReadAt(b, off)
	if err != nil && !(errors.Is(err, io.EOF) && got == n) {
		return nil, fmt.Errorf("read %s again at byte %d: %w", rf.name, off, err)
	}
	if got == n+1 && b[n] != '\n' && b[n] != '\r' {
		return nil, fmt.Errorf("read %s again at byte %d: the file changed (no line end after %d bytes)", rf.name, off, n)
	}
	return b[:n:n], nil
}

// DefaultMaxRecordBytes is the default limit on one record; larger records
// are dead-lettered as too_large with their first bytes.
const DefaultMaxRecordBytes = 64 << 20

// keepTooLarge is how much of a too-large record is kept for the dead-letter
// output.
const keepTooLarge = 64 << 10

var utf8BOM = []byte{0xef, 0xbb, 0xbf}

// LineSource reads JSON lines from a reader (a file or stdin).
type LineSource struct {
	name      string
	stream    string
	file      *RawFile // set for a file: records are referenced, not copied
	m         *mapped  // set for a mapped file: lines are handed out in place
	off       int64    // bytes consumed from r (after the mapping, if any)
	consumed  atomic.Int64
	r         *bufio.Reader
	closer    io.Closer
	maxRecord int
	chunkSize int
	// copyChunks: the kernel cannot populate the mapping's pages; its
	// chunks are copied out of the file (readCopy).
	copyChunks bool
	done       bool
	pending    *pendingLine
	pool       sync.Pool // released chunk buffers
	// stopped ends the input early (Stop): what was read from r is still
	// handed out, nothing more is read. interrupt, if set, wakes a read
	// blocked on a quiet pipe without consuming anything.
	stopped   atomic.Bool
	interrupt func()
}

// OpenFile opens path ("-" for stdin) as a LineSource. maxRecord <= 0 means
// DefaultMaxRecordBytes.
//
// A file's records carry a stream identity made of its absolute path and a
// fingerprint of its first 64 KiB, so that a restart over the same file
// (or the same file grown longer) skips what was settled, while a
// different file at the same path is read afresh. Stdin has no identity:
// it is never skipped.
func OpenFile(path string, maxRecord int) (*LineSource, error) {
	if path == "-" {
		return openStdin(maxRecord), nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open input: %w", err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open input: %w", err)
	}
	head := make([]byte, 64<<10)
	n, err := f.ReadAt(head, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		f.Close()
		return nil, fmt.Errorf("read input: %w", err)
	}
	sum := sha256.Sum256(head[:n])
	s := NewLineSource(path, f, f, maxRecord)
	s.stream = abs + "#" + hex.EncodeToString(sum[:8])
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
		s.file = &RawFile{name: path, f: f}
		if size := st.Size(); size > 0 {
			// Map the file as it is, up to its last newline; the rest (a
			// last line without one, lines appended later) is read after
			// the mapping by the reader positioned there.
			if data, err := mapFile(f, size); err == nil {
				end := bytes.LastIndexByte(data, '\n') + 1
				if _, err := f.Seek(int64(end), io.SeekStart); err != nil || end == 0 {
					unmapFile(data)
				} else {
					s.m, s.off = &mapped{data: data[:end], full: data}, int64(end)
				}
			}
		}
	}
	return s, nil
}

// NewLineSource reads lines from r, naming them name in lineage. closer,
// if not nil, is closed by Close.
func NewLineSource(name string, r io.Reader, closer io.Closer, maxRecord int) *LineSource {
	if maxRecord <= 0 {
		maxRecord = DefaultMaxRecordBytes
	}
	return &LineSource{
		name:      name,
		r:         bufio.NewReaderSize(r, 1<<20),
		closer:    closer,
		maxRecord: maxRecord,
		chunkSize: 1 << 20,
	}
}

// Read returns about a megabyte of lines at a time.
func (s *LineSource) Read(ctx context.Context) (Chunk, error) {
	c, err := s.read(ctx)
	pos := s.off
	if s.m != nil && s.m.pos < len(s.m.data) {
		pos = int64(s.m.pos)
	}
	s.consumed.Store(pos)
	return c, err
}

// Consumed is how many bytes of the input Read has handed out so far (a
// progress figure; safe to call from any goroutine).
func (s *LineSource) Consumed() int64 { return s.consumed.Load() }

func (s *LineSource) read(ctx context.Context) (Chunk, error) {
	var c Chunk
	if s.stopped.Load() && s.m == nil {
		s.done = true // hand out the pending line, read nothing more
	}
	if s.done && s.pending == nil {
		return c, io.EOF
	}
	if err := ctx.Err(); err != nil {
		return c, err
	}
	if s.m != nil && s.m.pos < len(s.m.data) {
		s.m.reading.Lock()
		defer s.m.reading.Unlock()
		if s.m.closed {
			return c, errors.New("read after close")
		}
		return s.readMapped(), nil
	}
	// One allocation holds the chunk's lines; records point into it. A line
	// that would not fit waits for the next chunk (growing the buffer would
	// copy the whole chunk).
	buf := s.buffer()
	c.Release = func() { s.pool.Put(&buf) }
	if p := s.pending; p != nil {
		s.pending = nil
		buf = s.add(&c, buf, p.data, p.truncated, p.size, p.off)
	}
	for !s.done && len(buf) < s.chunkSize {
		if s.off == 0 {
			// A byte-order mark is not part of the record, nor of its size.
			if b, err := s.r.Peek(len(utf8BOM)); err == nil && bytes.Equal(b, utf8BOM) {
				_, _ = s.r.Discard(len(utf8BOM))
				s.off += int64(len(utf8BOM))
			}
		}
		off := s.off
		data, truncated, size, err := s.readLine()
		if err == io.EOF {
			s.done = true
		} else if err != nil {
			return c, fmt.Errorf("read %s at byte %d: %w", s.name, s.off, err)
		}
		if len(buf) > 0 && len(buf)+len(data) > cap(buf) {
			s.pending = &pendingLine{data: append([]byte(nil), data...), truncated: truncated, size: size, off: off}
			break
		}
		if len(data) > 0 || truncated || err == nil {
			buf = s.add(&c, buf, data, truncated, size, off)
		}
		// On a quiet stream (stdin, a pipe) hand over what has arrived
		// rather than wait for a full chunk.
		if s.r.Buffered() == 0 && (len(c.Records) > 0 || c.Blank > 0) {
			break
		}
	}
	if len(c.Records) == 0 && c.Blank == 0 && s.done && s.pending == nil {
		return Chunk{}, io.EOF
	}
	return c, nil
}

// readMapped returns about a megabyte of whole lines of the mapping, in
// place, to be split by Chunk.Split, its pages faulted in at once
// (populate: one system call instead of a fault every few pages when the
// decoders touch them). Only the end of the last line is looked for here.
// Where pages cannot be faulted in that way, chunks are copied out of the
// file (readCopy).
func (s *LineSource) readMapped() Chunk {
	m := s.m
	start, end := m.pos, len(m.data)
	if e := start + s.chunkSize; e < end {
		end = e + bytes.IndexByte(m.data[e-1:], '\n') // found: data ends with one
	}
	copyChunk := s.copyChunks
	if !copyChunk {
		m.readAhead(end)
		if err := populate(m.data[start&^(pageSize-1) : end]); err != nil {
			// This chunk is copied; every later one too when the
			// kernel cannot populate at all.
			copyChunk, s.copyChunks = true, errors.Is(err, errors.ErrUnsupported)
		}
	}
	if copyChunk {
		if c, ok := s.readCopy(start, len(m.data)); ok {
			return c
		}
	}
	m.pos = end
	return Chunk{
		whole:   &lineRun{s: s, data: m.data[start:end], off: int64(start)},
		Release: m.hold(start, end),
	}
}

// readCopy reads about a megabyte of whole lines of the mapped range
// data[start:end] with pread into a recycled chunk buffer instead of
// touching the mapping: where pages cannot be populated, a page fault per
// few pages of a mapping costs more than copying the bytes
// (docs/performance.md#choices-behind-the-defaults). ok is false when the buffer
// holds no whole line (a line longer than a chunk) or the read comes up
// short (the file shrank): the mapping serves that chunk.
func (s *LineSource) readCopy(start, end int) (c Chunk, ok bool) {
	bp := s.bufferPtr()
	buf := (*bp)[:min(cap(*bp), end-start)]
	n, _ := s.file.f.ReadAt(buf, int64(start))
	nl := bytes.LastIndexByte(buf[:n], '\n')
	if n < len(buf) || nl < 0 {
		s.pool.Put(bp)
		return c, false
	}
	s.m.pos = start + nl + 1
	return Chunk{
		whole:   &lineRun{s: s, data: buf[: nl+1 : nl+1], off: int64(start)},
		Release: func() { s.pool.Put(bp) },
	}, true
}

// lineRun is a run of whole lines of a mapped file, each ended by a
// newline, starting at byte off.
type lineRun struct {
	s    *LineSource // read only: split runs on other goroutines
	data []byte
	off  int64
}

func (r *lineRun) split(c *Chunk) {
	data, off := r.data, r.off
	for len(data) > 0 {
		nl := bytes.IndexByte(data, '\n') // found: the run ends with one
		line := data[:nl:nl]
		full := int64(nl) // a CR counts, as the buffered reader counts a too-large line
		if nl > 0 && line[nl-1] == '\r' {
			line = line[: nl-1 : nl-1]
		}
		at := off
		if at == 0 && bytes.HasPrefix(line, utf8BOM) {
			line = line[len(utf8BOM):] // a byte-order mark is not part of the record
			at += int64(len(utf8BOM))
			full -= int64(len(utf8BOM))
		}
		if full > int64(r.s.maxRecord) {
			head := min(len(line), keepTooLarge)
			r.s.take(c, line[:head:head], true, full, at)
		} else {
			r.s.take(c, line, false, int64(len(line)), at)
		}
		data, off = data[nl+1:], off+int64(nl)+1
	}
}

// buffer returns an empty chunk buffer, reused when one was released.
func (s *LineSource) buffer() []byte {
	return (*s.bufferPtr())[:0]
}

// bufferPtr is buffer as the pointer the pool holds.
func (s *LineSource) bufferPtr() *[]byte {
	if b, ok := s.pool.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 0, s.chunkSize+64<<10)
	return &b
}

// pendingLine is a line read but left for the next chunk.
type pendingLine struct {
	data      []byte
	truncated bool
	size      int64
	off       int64
}

// add copies the next line into the chunk's buffer (a blank one is only
// counted) and takes it.
func (s *LineSource) add(c *Chunk, buf, data []byte, truncated bool, size, off int64) []byte {
	if !isBlank(data) || truncated {
		start := len(buf)
		buf = append(buf, data...)
		data = buf[start:len(buf):len(buf)]
	}
	s.take(c, data, truncated, size, off)
	return buf
}

// take counts the chunk's next line and adds it to c as a record, Data as
// given (blank lines are only counted). off is where it starts in the
// input. It reads only what OpenFile set, so chunks may be split on any
// goroutine.
func (s *LineSource) take(c *Chunk, data []byte, truncated bool, size, off int64) {
	c.Lines++
	if isBlank(data) && !truncated {
		c.Blank++
		return
	}
	r := Raw{
		Data:      data,
		Source:    schemas.Source{Stream: s.stream, File: s.name, Line: c.Lines},
		Truncated: truncated,
		Size:      size,
	}
	if s.file != nil && !truncated {
		r.Ref = RawRef{From: s.file, Off: off, Len: len(data)}
	}
	c.Records = append(c.Records, r)
}

func (s *LineSource) readLine() (data []byte, truncated bool, size int64, err error) {
	var long []byte
	for {
		frag, rerr := s.r.ReadSlice('\n')
		s.off += int64(len(frag))
		size += int64(len(frag))
		if rerr == nil {
			size-- // the newline
		}
		if long == nil && rerr == nil && size <= int64(s.maxRecord) {
			line := trimEOL(frag)
			return line, false, int64(len(line)), nil
		}
		if !truncated && size > int64(s.maxRecord) {
			truncated = true
			long = long[:min(len(long), keepTooLarge)]
		}
		if room := keepTooLarge - len(long); !truncated || room > 0 {
			if truncated && room < len(frag) {
				frag = frag[:room]
			}
			long = append(long, frag...)
		}
		switch {
		case rerr == nil:
			if truncated {
				return trimEOL(long), true, size, nil
			}
			line := trimEOL(long)
			return line, false, int64(len(line)), nil
		case errors.Is(rerr, bufio.ErrBufferFull):
			continue
		case rerr == io.EOF || s.stopped.Load():
			// The end, or a Stop interrupted the read: what was read of
			// the line is its last part.
			if truncated {
				return long, true, size, io.EOF
			}
			return long, false, int64(len(long)), io.EOF
		default:
			return nil, false, 0, rerr
		}
	}
}

func trimEOL(b []byte) []byte {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
		if n := len(b); n > 0 && b[n-1] == '\r' {
			b = b[:n-1]
		}
	}
	return b
}

func isBlank(b []byte) bool {
	for _, c := range b {
		if c != ' ' && c != '\t' && c != '\r' && c != '\n' {
			return false
		}
	}
	return true
}

// Stop ends the input where it is, for a source that cannot be read
// again (stdin): every record already read from the underlying reader is
// still handed out by Read, then io.EOF; nothing more is read. A read
// blocked on a quiet pipe returns at once when the source was opened by
// OpenFile("-"); otherwise the input ends after the current read. Safe
// to call from any goroutine, and more than once.
func (s *LineSource) Stop() {
	if s.stopped.CompareAndSwap(false, true) && s.interrupt != nil {
		s.interrupt()
	}
}

// Stream is the exactly-once identity of the input ("" for stdin).
func (s *LineSource) Stream() string { return s.stream }

// Close closes the underlying file, if any. Records it handed out must
// not be used after it.
func (s *LineSource) Close() error {
	if s.m != nil {
		s.m.close()
	}
	if s.closer == nil {
		return nil
	}
	c := s.closer
	s.closer = nil
	return c.Close()
}
