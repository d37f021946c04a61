package main

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// ingest, serve and consume write a CPU profile with --cpuprofile: a
// gzipped pprof file, complete once the command has stopped.
func TestTrainCommandsCPUProfile(t *testing.T) {
	bin := e2eBinary(t)
	out := serveShards(t, bin, 8, "--turns", "2..4")
	dir := t.TempDir()
	isProfile := func(what, path string) {
		t.Helper()
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if len(data) < 64 || !bytes.HasPrefix(data, []byte{0x1f, 0x8b}) {
			t.Fatalf("%s: %d bytes, not a gzipped pprof profile", what, len(data))
		}
	}
	cons := filepath.Join(dir, "consume.pprof")
	if r := e2eRun(t, bin, dir, "consume", "--from", out, "--follow=false", "--layout", "trajectories", "--cpuprofile", cons); r.code != 0 {
		t.Fatalf("consume: exit %d\n%s", r.code, r.stderr)
	}
	isProfile("consume", cons)
	srv := filepath.Join(dir, "serve.pprof")
	p := startServe(t, bin, out, nil, "--listen", "127.0.0.1:0", "--cpuprofile", srv)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.exitWithin(t, 30*time.Second); code != 0 {
		t.Fatalf("serve: exit %d\n%s", code, p.stderr)
	}
	isProfile("serve", srv)
	in := filepath.Join(dir, "in.jsonl")
	if r := e2eRun(t, bin, dir, "gen", "--to", in, "--groups", "20", "--group-size", "4", "--quiet"); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	ing := filepath.Join(dir, "ingest.pprof")
	if r := e2eRun(t, bin, dir, "ingest", "--from", in, "--to", filepath.Join(dir, "ing"), "--group-size", "4", "--quiet", "--cpuprofile", ing); r.code != 0 {
		t.Fatalf("ingest: exit %d\n%s", r.code, r.stderr)
	}
	isProfile("ingest", ing)
	if r := e2eRun(t, bin, dir, "consume", "--from", out, "--follow=false", "--cpuprofile", filepath.Join(dir, "no", "such", "dir")); r.code == 0 {
		t.Fatal("consume ran with a profile it cannot write")
	}
}
