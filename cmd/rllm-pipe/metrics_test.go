package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMetricsToken: --metrics-addr beyond loopback needs a token of at
// least 16 bytes (that /metrics then requires: the metrics package's
// TestHandlerToken).
func TestMetricsToken(t *testing.T) {
	t.Setenv("RLLM_PIPE_METRICS_TOKEN", "")
	dir := t.TempDir()
	short, long := filepath.Join(dir, "short"), filepath.Join(dir, "long")
	if err := os.WriteFile(short, []byte("abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const tok = "0123456789abcdef-metrics"
	if err := os.WriteFile(long, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		addr, file, err string
	}{
		{"127.0.0.1:0", "", ""},
		{"localhost:0", "", ""},
		{"[::1]:0", "", ""},
		{"0.0.0.0:9464", "", "beyond loopback"},
		{":9464", "", "beyond loopback"},
		{"192.0.2.1:9464", short, "want at least 16"},
		{"0.0.0.0:9464", long, ""},
	} {
		got, err := metricsToken(c.addr, c.file)
		if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%s with %q: %v, want %q", c.addr, c.file, err, c.err)
		}
		if c.file == long && got != tok {
			t.Errorf("%s: token %q, want %q", c.addr, got, tok)
		}
	}
}
