package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/flight"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	trainflight "github.com/rllm-pipe/rllm-pipe/train/flight"
)

// serveShards generates groups groups of 4 and ingests them into small
// shards; extra goes to gen.
func serveShards(t *testing.T, bin string, groups int, extra ...string) string {
	t.Helper()
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.jsonl"), filepath.Join(dir, "out")
	if r := e2eRun(t, bin, dir, append([]string{"gen", "--groups", strconv.Itoa(groups), "--group-size", "4", "--to", in}, extra...)...); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	if r := e2eRun(t, bin, dir, "ingest", "--from", in, "--to", out, "--group-size", "4", "--shard-size", "256KiB", "--quiet"); r.code != 0 {
		t.Fatalf("ingest: %s", r.stderr)
	}
	return out
}

// serveProc is a running `rllm-pipe serve`.
type serveProc struct {
	cmd    *exec.Cmd
	addr   string
	stderr *serveLog
	done   chan error
}

type serveLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *serveLog) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *serveLog) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startServe runs serve over from on loopback with args and env; killed at
// cleanup.
func startServe(t *testing.T, bin, from string, env []string, args ...string) *serveProc {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "ready")
	p := &serveProc{stderr: &serveLog{}, done: make(chan error, 1)}
	p.cmd = exec.Command(bin, append([]string{"serve", "--from", from, "--listen", "127.0.0.1:0", "--ready-file", ready, "--follow=false", "--poll", "50ms"}, args...)...)
	p.cmd.Env = append(e2eEnv(), env...)
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		if data, err := os.ReadFile(ready); err == nil && strings.HasSuffix(string(data), "\n") {
			p.addr = strings.TrimSpace(string(data))
			return p
		}
		select {
		case err := <-p.done:
			p.done <- err // for the cleanup
			t.Fatalf("serve exited: %v\n%s", err, p.stderr)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not start\n%s", p.stderr)
		}
	}
}

// rss is the process's resident memory, bytes.
func (p *serveProc) rss(t *testing.T) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// exitWithin waits for serve to exit and returns its code.
func (p *serveProc) exitWithin(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err // for the cleanup
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(d):
		t.Fatalf("serve still running %v later\n%s", d, p.stderr)
		return -1
	}
}

func serveClient(t *testing.T, addr string) flight.Client {
	t.Helper()
	cli, err := flight.NewClientWithMiddleware(addr, nil, nil, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// serveDrain reads every batch as a trainer does, acknowledging each, and
// returns how many groups it got; a refusal because the server is full is
// retried.
func serveDrain(ctx context.Context, t *testing.T, cli flight.Client, name string) int {
	t.Helper()
	key := name + "-key-0123456789abcdef"
	for {
		stream, err := cli.DoGet(ctx, &flight.Ticket{Ticket: []byte(`{"consumer":"` + name + `","key":"` + key + `"}`)})
		if err != nil {
			t.Fatal(err)
		}
		rd, err := flight.NewRecordReader(stream)
		if status.Code(err) == codes.ResourceExhausted && ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatalf("trainer: %v", err)
		}
		defer rd.Release()
		groups := 0
		for rd.Next() {
			var m trainflight.BatchMeta
			_ = json.Unmarshal(rd.LatestAppMetadata(), &m)
			groups += len(m.Groups)
			body, _ := json.Marshal(map[string]any{"consumer": name, "key": key, "batch_ids": []uint64{m.BatchID}})
			res, err := cli.DoAction(ctx, &flight.Action{Type: "ack", Body: body})
			if err == nil {
				_, err = res.Recv()
			}
			if err != nil {
				t.Fatalf("trainer's ack: %v", err)
			}
		}
		if rd.Err() != nil {
			t.Fatalf("trainer: %v", rd.Err())
		}
		return groups
	}
}

// TestServeFlagsAndListen: versions out of range and an address beyond
// loopback without a token are usage errors; a token (from the
// environment) opens it; an empty token file is refused.
func TestServeFlagsAndListen(t *testing.T) {
	bin := e2eBinary(t)
	out := serveShards(t, bin, 8)
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"serve", "--from", out, "--listen", "0.0.0.0:0"},
		{"serve", "--from", out, "--listen", ":0"},
		{"serve", "--from", out, "--policy-version", "-1"},
		{"serve", "--from", out, "--policy-version", "18014398509481984"}, // 2^54
		{"serve", "--from", out, "--max-staleness", "-2"},
		{"serve", "--from", out, "--max-staleness", "9223372036854775807"},
		{"serve", "--from", out, "--token-file", empty},
		{"serve", "--from", out, "--tls-cert", empty},
		{"serve", "--from", out, "--max-streams", "0"},
		{"serve", "--from", out, "--send-timeout", "0s"},
		{"consume", "--from", out, "--policy-version", "-5"},
	} {
		if args[0] == "serve" && !contains(args, "--listen") {
			args = append(args, "--listen", "127.0.0.1:0") // refused for the flag, not the address
		}
		r := e2eRun(t, bin, dir, args...)
		if r.code != exitUsage {
			t.Errorf("%q: exit %d, want %d\n%s", args, r.code, exitUsage, r.stderr)
		}
		if contains(args, "0.0.0.0:0") && !strings.Contains(r.stderr, "beyond loopback") {
			t.Errorf("%q: %s", args, r.stderr)
		}
	}
	const secret = "token-from-env-7d3f9a1c"
	p := startServe(t, bin, out, []string{"RLLM_PIPE_TOKEN=" + secret}, "--listen", "0.0.0.0:0")
	if strings.Contains(p.stderr.String(), secret) {
		t.Errorf("the token is in the log")
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.exitWithin(t, 30*time.Second); code != 0 {
		t.Errorf("serve with a token beyond loopback: exit %d\n%s", code, p.stderr)
	}
	if strings.Contains(p.stderr.String(), secret) {
		t.Errorf("the token is in the log")
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestServeIdleStreams: 1,000 streams that never read, over 250
// connections, are refused beyond --max-streams and the server's memory
// stays bounded; the accepted ones are dropped for want of
// acknowledgements and a real trainer gets every group.
func TestServeIdleStreams(t *testing.T) {
	bin := e2eBinary(t)
	const groups = 60
	out := serveShards(t, bin, groups)
	p := startServe(t, bin, out, nil, "--ack-timeout", "2s")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	before := p.rss(t)
	var (
		mu       sync.Mutex
		outcome  = map[string]int{}
		wg       sync.WaitGroup
		accepted []flight.FlightService_DoGetClient
	)
	for c := 0; c < 250; c++ {
		cli := serveClient(t, p.addr)
		for i := 0; i < 4; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s, err := cli.DoGet(ctx, &flight.Ticket{Ticket: []byte(fmt.Sprintf(`{"consumer":"idle-%d-%d"}`, c, i))})
				var md metadata.MD
				if err == nil {
					md, err = s.Header()
				}
				if err == nil && md == nil {
					_, err = s.Recv()
				}
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					accepted = append(accepted, s)
					outcome["accepted"]++
					return
				}
				outcome[status.Code(err).String()]++
			}()
		}
	}
	wg.Wait()
	grown := p.rss(t) - before
	t.Logf("1,000 idle streams: %v; serve's memory grew %d MiB", outcome, grown>>20)
	if outcome["accepted"] > 64 || outcome[codes.ResourceExhausted.String()] < 1000-64 {
		t.Errorf("1,000 idle streams: %v, want at most 64 (--max-streams) accepted, the rest refused", outcome)
	}
	// Each accepted stream holds a decoded shard and a batch (unbounded,
	// 1,000 streams took +330 MiB); the race detector multiplies memory.
	limit := int64(192 << 20)
	if raceEnabled {
		limit = 768 << 20
	}
	if grown > limit {
		t.Errorf("serve's memory grew %d MiB for 1,000 idle streams, want at most %d", grown>>20, limit>>20)
	}
	got := serveDrain(ctx, t, serveClient(t, p.addr), "trainer")
	if got != groups {
		t.Errorf("the trainer got %d groups beside the idle streams, want %d", got, groups)
	}
}

// TestServeStopWithStuckReader: a client that stops reading mid-stream does
// not keep serve alive: the first SIGTERM ends it within --shutdown-grace,
// and with a long grace a second SIGTERM ends it at once.
func TestServeStopWithStuckReader(t *testing.T) {
	bin := e2eBinary(t)
	// Batches of megabytes: the reader's flow-control window fills.
	out := serveShards(t, bin, 40, "--response-len", "8000")
	for _, c := range []struct {
		name    string
		flags   []string
		signals int
		within  time.Duration
	}{
		{"first signal, grace", []string{"--send-timeout", "1h", "--ack-timeout", "0", "--shutdown-grace", "1s"}, 1, 8 * time.Second},
		// Default flags (a 10 s grace, 30 s send timeout): the second
		// signal ends serve at once.
		{"second signal", nil, 2, 5 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := startServe(t, bin, out, nil, append([]string{"--max-tokens", "1000000", "--max-inflight", "64", "--consumer-group", "stuck-" + strconv.Itoa(c.signals)}, c.flags...)...)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s, err := serveClient(t, p.addr).DoGet(ctx, &flight.Ticket{Ticket: []byte(`{"consumer":"stuck"}`)})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Header(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Second) // serve's send blocks on the full window
			start := time.Now()
			for i := 0; i < c.signals; i++ {
				_ = p.cmd.Process.Signal(syscall.SIGTERM)
				time.Sleep(200 * time.Millisecond)
			}
			p.exitWithin(t, 20*time.Second)
			if d := time.Since(start); d > c.within {
				t.Errorf("serve exited %v after the signal", d)
			}
		})
	}
}

// TestServeShortTokenBeyondLoopback: beyond loopback a token shorter than
// 16 bytes is refused (exit 2, naming the flag); on loopback it is not
// this check's business.
func TestServeShortTokenBeyondLoopback(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	shortMember := filepath.Join(dir, "members")
	if err := os.WriteFile(shortMember, []byte("rank-0 x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"serve", "--from", dir, "--listen", "0.0.0.0:0", "--token-file", short},
		{"serve", "--from", dir, "--listen", ":0", "--admin-token-file", short},
		{"serve", "--from", dir, "--listen", ":0", "--member-tokens-file", shortMember},
	} {
		var stderr bytes.Buffer
		flag := args[len(args)-2]
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // a serve that started
		defer cancel()
		if code := run(ctx, args, io.Discard, &stderr); code != exitUsage || !strings.Contains(stderr.String(), flag) || !strings.Contains(stderr.String(), "at least 16") {
			t.Errorf("%v: exit %d, want %d naming %s; stderr: %s", args, code, exitUsage, flag, stderr.String())
		}
	}
}
