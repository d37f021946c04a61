//go:build unix

package ingest

import (
	"os"
	"syscall"
	"time"
)

// openStdin reads stdin through a non-blocking duplicate of its
// descriptor, so that Stop can wake a read blocked on a quiet pipe or
// terminal (a read deadline) without consuming anything. A regular file
// or a descriptor the poller refuses is read as it is: its reads do not
// block for long. Close puts the descriptor back in blocking mode (the
// flag is shared with whoever else holds it, such as the shell).
func openStdin(maxRecord int) *LineSource { return openStoppable(os.Stdin, maxRecord) }

// openStoppable reads in (stdin, or a pipe in tests) as described above.
func openStoppable(in *os.File, maxRecord int) *LineSource {
	fi, err := in.Stat()
	if err != nil || fi.Mode().IsRegular() {
		return NewLineSource("-", in, nil, maxRecord)
	}
	fd, err := syscall.Dup(int(in.Fd()))
	if err != nil {
		return NewLineSource("-", in, nil, maxRecord)
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return NewLineSource("-", in, nil, maxRecord)
	}
	f := os.NewFile(uintptr(fd), in.Name())
	if f.SetReadDeadline(time.Time{}) != nil {
		// Not pollable: read it blocking, as before.
		_ = syscall.SetNonblock(fd, false)
		f.Close()
		return NewLineSource("-", in, nil, maxRecord)
	}
	s := NewLineSource("-", f, stdinCloser{f}, maxRecord)
	s.interrupt = func() { _ = f.SetReadDeadline(time.Now()) }
	return s
}

// stdinCloser restores blocking mode and closes the duplicate.
type stdinCloser struct{ f *os.File }

func (c stdinCloser) Close() error {
	if rc, err := c.f.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _ = syscall.SetNonblock(int(fd), false) })
	}
	return c.f.Close()
}
