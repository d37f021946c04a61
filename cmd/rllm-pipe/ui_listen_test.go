package main

// Where `rllm-pipe ui` agrees to listen without a token: loopback,
// localhost included; anywhere else it refuses with a usage error.

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestUIListenAddr(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		addr     string
		loopback bool
	}{
		{"127.0.0.1:8817", true},
		{"[::1]:8817", true},
		{"localhost:8817", true},
		{"LocalHost:0", true},
		{"0.0.0.0:8817", false},
		{":8817", false},
		{"example.com:8817", false},
		{"localhost", false},
	} {
		got, loopback := uiListenAddr(ctx, tc.addr)
		if loopback != tc.loopback {
			t.Errorf("%s: loopback %v, want %v", tc.addr, loopback, tc.loopback)
		}
		if loopback {
			host, _, err := net.SplitHostPort(got)
			if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
				t.Errorf("%s: listens on %s, not a loopback IP", tc.addr, got)
			}
		}
	}
}

// TestUIListenCLI: the real binary serves on localhost:0 without a
// token, and refuses 0.0.0.0 without one (exit 2).
func TestUIListenCLI(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	in := filepath.Join(work, "in.jsonl")
	if r := e2eRun(t, bin, work, "gen", "--to", in, "--groups", "8", "--group-size", "4", "--seed", "2", "--prompt-len", "20", "--response-len", "10", "--quiet"); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	from := filepath.Join(work, "out")
	if r := e2eRun(t, bin, work, "ingest", "--from", in, "--to", from, "--group-size", "4", "--quiet"); r.code != 0 {
		t.Fatalf("ingest: %s", r.stderr)
	}
	r := e2eRun(t, bin, work, "ui", "--from", from, "--listen", "0.0.0.0:0")
	if r.code != 2 || !strings.Contains(r.stderr, "beyond loopback") {
		t.Errorf("ui --listen 0.0.0.0:0 without a token: exit %d, %s; want 2, beyond loopback", r.code, r.stderr)
	}
	// Nor with a token short enough to guess (as serve and gateway).
	short := filepath.Join(work, "short-token")
	if err := os.WriteFile(short, []byte("a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = e2eRun(t, bin, work, "ui", "--from", from, "--listen", "0.0.0.0:0", "--token-file", short)
	if r.code != 2 || !strings.Contains(r.stderr, "want at least 16") {
		t.Errorf("ui --listen 0.0.0.0:0 with a 1-byte token: exit %d, %s; want 2, want at least 16", r.code, r.stderr)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := filepath.Join(work, "ui.addr")
	ui := exec.CommandContext(ctx, bin, "ui", "--from", from, "--listen", "localhost:0", "--ready-file", ready)
	ui.Dir, ui.Env = work, e2eEnv()
	var stderr syncBuffer
	ui.Stderr = &stderr
	if err := ui.Start(); err != nil {
		t.Fatal(err)
	}
	defer terminate(t, ui, waitChan(ui), &stderr)
	re := regexp.MustCompile(`serving .* on (http://[^ ]+/)`)
	var base string
	waitFor(t, 30*time.Second, "ui --listen localhost:0 serving", func() bool {
		m := re.FindStringSubmatch(stderr.String())
		if m == nil {
			return false
		}
		base = m[1]
		return true
	})
	if !strings.HasPrefix(base, "http://127.0.0.1:") && !strings.HasPrefix(base, "http://[::1]:") {
		t.Errorf("ui --listen localhost:0 serves on %s, not loopback", base)
	}
	// The ready file holds the same address once it listens, before the
	// first build ends; the pages answer from then on (503 and "building"
	// until the views are there).
	if data, err := os.ReadFile(ready); err != nil || "http://"+strings.TrimSpace(string(data))+"/" != base {
		t.Errorf("--ready-file: %q (%v), want the address of %s", data, err, base)
	}
	waitFor(t, 30*time.Second, "ui's first build", func() bool {
		resp, err := http.Get(base + "api/state")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("GET api/state: %d", resp.StatusCode)
		}
		return resp.StatusCode == http.StatusOK
	})
}
