package main

import "syscall"

// childAttrs makes the iceberg follower die with ingest, even a killed
// one (the follower's syncs are safe to stop anywhere).
func childAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
