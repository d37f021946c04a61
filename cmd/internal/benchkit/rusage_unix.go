//go:build unix

package benchkit

import (
	"os"
	"runtime"
	"syscall"
)

// PeakRSS returns the finished child's peak resident set size in bytes
// (getrusage's ru_maxrss: kilobytes on Linux, bytes on macOS), or 0 when
// the platform does not report it.
func PeakRSS(ps *os.ProcessState) int64 {
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok || ru == nil {
		return 0
	}
	if runtime.GOOS == "darwin" || runtime.GOOS == "ios" {
		return int64(ru.Maxrss)
	}
	return int64(ru.Maxrss) * 1024
}
