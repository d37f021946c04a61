//go:build unix

package main

import (
	"os"
	"syscall"
)

// execIceberg replaces this process with rllm-pipe-iceberg: its exit
// code and signals are the command's.
func execIceberg(exe string, args []string) error {
	return syscall.Exec(exe, append([]string{icebergExe}, args...), os.Environ())
}
