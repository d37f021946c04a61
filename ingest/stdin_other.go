//go:build !unix

package ingest

import "os"

// openStdin reads stdin as it is: Stop ends the input after the read in
// progress.
func openStdin(maxRecord int) *LineSource {
	return NewLineSource("-", os.Stdin, nil, maxRecord)
}
