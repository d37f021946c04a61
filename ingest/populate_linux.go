package ingest

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// populate faults the pages of b (page aligned) in, page tables included,
// in one call. Its error wraps errors.ErrUnsupported when the kernel
// cannot (MADV_POPULATE_READ came with Linux 5.14); any other failure
// (memory pressure, a file that shrank) is the call's own.
func populate(b []byte) error {
	err := unix.Madvise(b, unix.MADV_POPULATE_READ)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		return fmt.Errorf("%w: %w", errors.ErrUnsupported, err)
	}
	return err
}
