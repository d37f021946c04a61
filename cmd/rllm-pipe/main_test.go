package main

import (
	"testing"

	"go.uber.org/goleak"
)

// Idle keep-alive connections of the HTTP clients' pools (the S3 checks)
// are not leaks.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"))
}
