//go:build linux || darwin || freebsd

package ingest

import (
	"os"

	"golang.org/x/sys/unix"
)

// mapFile maps f's first size bytes read-only, for sequential reading.
func mapFile(f *os.File, size int64) ([]byte, error) {
	b, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	_ = unix.Madvise(b, unix.MADV_SEQUENTIAL) // a hint only
	return b, nil
}

// dropPages tells the kernel the process is done with b (page aligned):
// its pages leave the process's resident set (they stay in the page
// cache).
func dropPages(b []byte) { _ = unix.Madvise(b, unix.MADV_DONTNEED) }

// willNeed asks the kernel to read b's pages (page aligned) into the page
// cache in the background.
func willNeed(b []byte) { _ = unix.Madvise(b, unix.MADV_WILLNEED) }

func unmapFile(b []byte) error { return unix.Munmap(b) }

func osPageSize() int { return os.Getpagesize() }
