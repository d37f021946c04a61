//go:build !unix

package main

import (
	"errors"
	"os"
	"os/exec"
)

// execIceberg runs rllm-pipe-iceberg with this process's input and
// output, and exits with its exit code.
func execIceberg(exe string, args []string) error {
	cmd := exec.Command(exe, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		os.Exit(ee.ExitCode())
	}
	return err
}
