package ingest

import (
	"slices"
	"sync"
)

// mapped is a file mapped into memory up to its last newline at open.
// Its chunks of whole lines are handed out in place, each chunk's pages
// faulted in by one system call (LineSource.readMapped); where the kernel
// cannot do that, they are read with pread into recycled buffers
// (LineSource.readCopy: cheaper than faulting the pages in one by one),
// and the mapping serves, in place, a line longer than a buffer. Released chunks
// of the mapping let their pages go from the process's memory, so the
// resident set stays a few megabytes however large the file; the pages
// stay in the kernel's page cache.
//
// The mapping covers the file up to its last newline at open; the rest,
// and lines appended later, are read through the ordinary reader. A file
// that shrinks under a running ingest faults on the missing pages; the
// decode stage turns the fault into an error (stage.go): the run stops,
// and the next run resumes after its last commit.
type mapped struct {
	data []byte // the mapping up to its last newline
	full []byte // the whole mapping
	pos  int    // next byte to hand out

	// reading is held while lines are taken from the mapping, so that
	// Close (which may come from another goroutine on a stop) never
	// unmaps under a read.
	reading sync.Mutex
	closed  bool // under both locks

	ahead int // data[:ahead] was asked for ahead of use (readAhead); under reading

	mu      sync.Mutex
	open    []int // start of each chunk handed out and not released
	handed  int   // end of the last chunk handed out
	dropped int   // data[:dropped] was given back
}

// dropEvery is how far the released prefix must have grown before its
// pages are given back (one system call per step).
const dropEvery = 4 << 20

// hold notes the chunk data[off:end] as handed out; the returned func
// releases it.
func (m *mapped) hold(off, end int) func() {
	m.mu.Lock()
	m.open = append(m.open, off)
	m.handed = end
	m.mu.Unlock()
	return func() { m.release(off) }
}

func (m *mapped) release(off int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return // unmapped: the range may be someone else's memory now
	}
	if i := slices.Index(m.open, off); i >= 0 {
		m.open = slices.Delete(m.open, i, i+1)
	}
	low := m.handed // nothing below the oldest chunk still out is in use
	for _, o := range m.open {
		low = min(low, o)
	}
	low &^= pageSize - 1
	if low-m.dropped >= dropEvery {
		dropPages(m.data[m.dropped:low])
		m.dropped = low
	}
}

var pageSize = osPageSize()

// Where the file is not in the page cache, each chunk's populate waits for
// the disk, and the decoders wait for the chunk. The kernel is asked
// instead (asynchronously, MADV_WILLNEED) to read readAheadBytes past the
// chunk being handed out, renewed each time readAheadStep of it was used:
// the disk keeps reading while the decoders work. The hint maps nothing
// into the process (its resident set does not grow); pages already cached
// cost a look-up.
const (
	readAheadBytes = 32 << 20
	readAheadStep  = 4 << 20
)

// adviseWillNeed is willNeed; tests replace it to see the hints.
var adviseWillNeed = willNeed

// readAhead asks for the file past a chunk ending at end to be read in,
// when it is time (readAheadRange). The caller holds m.reading.
func (m *mapped) readAhead(end int) {
	if lo, hi, ok := readAheadRange(m.ahead, end, len(m.data)); ok {
		adviseWillNeed(m.data[lo:hi])
		m.ahead = hi
	}
}

// readAheadRange is the range [lo, hi) of a mapping of size bytes to ask
// for after a chunk ending at end, given that [0, ahead) was asked for
// already: from the page holding the first byte past both (lo, page
// aligned) to readAheadBytes past end or the end of the mapping; ok is
// false when nothing is left to ask for, or less than readAheadStep short
// of the end of the mapping.
func readAheadRange(ahead, end, size int) (lo, hi int, ok bool) {
	lo = max(ahead, end)
	hi = min(end+readAheadBytes, size)
	if hi <= lo || hi-lo < readAheadStep && hi < size {
		return 0, 0, false
	}
	return lo &^ (pageSize - 1), hi, true
}

// close unmaps the file once no read is under way.
func (m *mapped) close() {
	m.reading.Lock()
	defer m.reading.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.closed {
		m.closed = true
		unmapFile(m.full)
	}
}
