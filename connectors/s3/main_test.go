package s3

import (
	"testing"

	"go.uber.org/goleak"
)

// Idle keep-alive connections of the HTTP client's pool are not leaks.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"))
}
