package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
)

// startCPUProfile writes a CPU profile of the process to path (for go
// tool pprof) until stop is called; with an empty path it does nothing.
// The commands with --cpuprofile call it once their flags are valid.
func startCPUProfile(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		return nil, errors.Join(fmt.Errorf("cpuprofile: %w", err), f.Close())
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return fmt.Errorf("cpuprofile: %w", err)
		}
		return nil
	}, nil
}
