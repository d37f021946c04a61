//go:build !linux

package main

import "github.com/rllm-pipe/rllm-pipe/ingest"

// openStdin reads stdin for ingest; its stop ends the input where the
// reader is.
func openStdin(maxRecord int) (*ingest.LineSource, func(), error) {
	src, err := ingest.OpenFile("-", maxRecord)
	if err != nil {
		return nil, nil, err
	}
	return src, src.Stop, nil
}
