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
