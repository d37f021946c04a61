//go:build !unix

package recordlog

import (
	"fmt"
	"os"
)

// lock opens the lock file; without flock on this platform a second
// writer is not detected.
func lock(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock: %w", err)
	}
	return f, nil
}
