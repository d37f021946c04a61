package main

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// TestMain makes the directory e2eBinary builds the binary into, once for
// the run, and checks for leaked goroutines after the tests. Idle
// keep-alive connections of the HTTP clients' pools (the S3 checks) are
// not leaks.
//
// The long tests that spend their time waiting on child processes (kills
// and restarts, consumer groups, Kafka, MinIO, DuckDB) run in parallel
// (t.Parallel), each on its own directories, topic, consumer group and
// S3 prefix; Go starts them once every other test has finished. Tests
// stay sequential when they stop the shared services
// (TestIntegrationOutages), set the environment, run the CLI in this
// process, or hold deadlines of a second or two that a busy machine
// misses: consumer leases of 1–2 s (run beside the parallel tests, a
// member's renewal came late, its shard was taken over and a group
// delivered twice), idle timeouts.
func TestMain(m *testing.M) {
	raceNoExitSleep()
	dir, err := os.MkdirTemp("", "rllm-pipe-e2e-bin-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, "TestMain:", err)
		os.Exit(1)
	}
	e2eBuild.dir = dir
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.Cleanup(func(code int) {
			os.RemoveAll(dir)
			os.Exit(code)
		}))
}

// longTier reports whether the long tier runs (RLLM_TEST_LONG=1, `make
// test-long`, which CI runs after `make test`): the crash and outage
// scenarios at full length (more kills, longer outages). `make test` runs
// them shorter, to stay within its time.
func longTier() bool { return os.Getenv("RLLM_TEST_LONG") == "1" }

// raceNoExitSleep stops the binaries the tests launch from sleeping before
// they exit: a binary built with -race sleeps GORACE's atexit_sleep_ms
// (1 s by default) at exit, and the tests launch it hundreds of times.
// Races are still reported while it runs, and fail the test (exit 66).
// A GORACE that sets atexit_sleep_ms itself is kept.
func raceNoExitSleep() {
	if g := os.Getenv("GORACE"); !strings.Contains(g, "atexit_sleep_ms") {
		os.Setenv("GORACE", strings.TrimSpace(g+" atexit_sleep_ms=0"))
	}
}
