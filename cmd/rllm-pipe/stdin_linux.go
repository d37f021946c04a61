package main

import (
	"errors"
	"io"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rllm-pipe/rllm-pipe/ingest"
)

// openStdin reads stdin for ingest. A pipe or terminal is read through a
// non-blocking duplicate of its descriptor (the poller), so that Stop can
// wake a read blocked on a quiet pipe; Stop then reads what the pipe
// already holds, without blocking, until it is empty, and releases the
// pipe (a producer's later writes fail with EPIPE instead of succeeding
// into a pipe nobody reads): every write that returned before the stop
// is read. A producer writing on through the stop can land writes in the
// instant between the last read and the release, which a pipe cannot
// refuse and nobody reads; the pipe is shrunk to one page before that
// last read, so those are at most 4 KiB. The source ends as at the end of
// the input, so every line read is handed out. Anything else (a regular
// file) is read by ingest.OpenFile.
func openStdin(maxRecord int) (*ingest.LineSource, func(), error) {
	fi, err := os.Stdin.Stat()
	if err != nil || fi.Mode().IsRegular() {
		return openPlainStdin(maxRecord)
	}
	fd, err := syscall.Dup(0)
	if err != nil {
		return openPlainStdin(maxRecord)
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return openPlainStdin(maxRecord)
	}
	f := os.NewFile(uintptr(fd), "stdin")
	if f.SetReadDeadline(time.Time{}) != nil { // not pollable
		_ = syscall.SetNonblock(fd, false)
		f.Close()
		return openPlainStdin(maxRecord)
	}
	r := &stdinReader{f: f, fd: fd}
	return ingest.NewLineSource("-", r, r, maxRecord), r.stop, nil
}

func openPlainStdin(maxRecord int) (*ingest.LineSource, func(), error) {
	src, err := ingest.OpenFile("-", maxRecord)
	if err != nil {
		return nil, nil, err
	}
	return src, src.Stop, nil
}

// stdinReader is stdin's duplicate: see openStdin. Read is called from
// one goroutine; stop from any.
type stdinReader struct {
	f        *os.File
	fd       int
	stopping atomic.Bool
	shrunk   bool // the pipe was shrunk (or cannot be) for the last read
	tries    int  // shrinks refused because the pipe held more
	released bool
}

func (r *stdinReader) stop() {
	if r.stopping.CompareAndSwap(false, true) {
		_ = r.f.SetReadDeadline(time.Now()) // wakes a blocked read
	}
}

func (r *stdinReader) Read(p []byte) (int, error) {
	if r.released {
		return 0, io.EOF
	}
	if !r.stopping.Load() {
		n, err := r.f.Read(p)
		if n > 0 || err == nil || !errors.Is(err, os.ErrDeadlineExceeded) || !r.stopping.Load() {
			return n, err
		}
	}
	// Stopped: what the pipe holds, without waiting for more.
	for {
		n, err := syscall.Read(r.fd, p)
		switch {
		case n > 0:
			return n, nil
		case errors.Is(err, syscall.EINTR):
			continue
		case err == nil || errors.Is(err, syscall.EAGAIN):
			if !r.shrunk && r.tries < 100 {
				// Empty: shrink the pipe to a page (refused while it holds
				// more than that: read it, and try again), so that what a
				// producer still writing can land before the release is
				// at most a page; then read to empty once more.
				r.tries++
				_, err := unix.FcntlInt(uintptr(r.fd), unix.F_SETPIPE_SZ, os.Getpagesize())
				r.shrunk = !errors.Is(err, unix.EBUSY)
				continue
			}
			r.release()
			return 0, io.EOF
		default:
			return 0, err
		}
	}
}

// release gives the pipe up: stdin becomes /dev/null, and the duplicate
// is closed in blocking mode (the flag is shared with whoever else holds
// the pipe).
func (r *stdinReader) release() {
	if r.released {
		return
	}
	r.released = true
	_ = syscall.SetNonblock(r.fd, false)
	if null, err := syscall.Open(os.DevNull, syscall.O_RDONLY, 0); err == nil {
		_ = syscall.Dup3(null, 0, 0)
		syscall.Close(null)
	}
	r.f.Close()
}

// Close releases the pipe if the input did not end through a stop.
func (r *stdinReader) Close() error {
	if !r.released {
		r.released = true
		_ = syscall.SetNonblock(r.fd, false)
		return r.f.Close()
	}
	return nil
}
