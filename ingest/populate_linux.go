package ingest

import "golang.org/x/sys/unix"

// populate faults the pages of b (page aligned) in, page tables included,
// in one call; false when the kernel cannot (MADV_POPULATE_READ came with
// Linux 5.14).
func populate(b []byte) bool { return unix.Madvise(b, unix.MADV_POPULATE_READ) == nil }
