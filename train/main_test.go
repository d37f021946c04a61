package train

import (
	"flag"
	"testing"

	"go.uber.org/goleak"
)

// Every consumer test of the package folds done shards into the low
// watermark (see fold_test.go), far more often than a run does;
// benchmarks keep the defaults. Idle keep-alive connections of the S3
// client's pool are not leaks.
func TestMain(m *testing.M) {
	flag.Parse()
	if flag.Lookup("test.bench").Value.String() == "" {
		foldEvery, foldMax = 2, 5
	}
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"))
}
