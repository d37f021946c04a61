//go:build unix

package recordlog

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lock takes an exclusive flock on path (released by the kernel when the
// process ends, however it ends).
func lock(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrLocked, path)
		}
		return nil, fmt.Errorf("lock: %w", err)
	}
	return f, nil
}
