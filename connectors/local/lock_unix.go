//go:build unix

package local

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
)

// lockRoot takes the writer's exclusive lock on path (flock: released by
// the kernel when the process ends, however it ends) and writes who holds
// it there, for the message a second writer gets.
func lockRoot(path, writer string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder := make([]byte, 256)
		n, _ := f.ReadAt(holder, 0)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			who := strings.TrimSpace(string(holder[:n]))
			if who == "" {
				who = "unknown"
			}
			return nil, fmt.Errorf("%w (%s): one writer per folder; wait for it to finish, or write elsewhere", store.ErrLocked, who)
		}
		return nil, fmt.Errorf("lock: %w", err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(fmt.Sprintf("pid %d, writer %s\n", os.Getpid(), writer)), 0)
	}
	return f, nil
}
