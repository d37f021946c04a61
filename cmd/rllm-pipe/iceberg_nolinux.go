//go:build !linux

package main

import "syscall"

// childAttrs: elsewhere than Linux the follower outlives a killed ingest
// until its next sync fails to find its parent's output (it is safe to
// stop anywhere).
func childAttrs() *syscall.SysProcAttr { return nil }
