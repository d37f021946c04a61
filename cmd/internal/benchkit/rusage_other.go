//go:build !unix

package benchkit

import "os"

// PeakRSS is not available on this platform.
func PeakRSS(*os.ProcessState) int64 { return 0 }
