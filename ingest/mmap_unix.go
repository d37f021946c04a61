//go:build linux || darwin || freebsd

package ingest

import (
	"os"
	"syscall"
)

// mapFile maps f's first size bytes read-only, for sequential reading.
func mapFile(f *os.File, size int64) ([]byte, error) {
	b, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	_ = syscall.Madvise(b, syscall.MADV_SEQUENTIAL) // a hint only
	return b, nil
}

// dropPages tells the kernel the process is done with b (page aligned):
// its pages leave the process's resident set (they stay in the page
// cache).
func dropPages(b []byte) { _ = syscall.Madvise(b, syscall.MADV_DONTNEED) }

func unmapFile(b []byte) error { return syscall.Munmap(b) }

func osPageSize() int { return os.Getpagesize() }
