//go:build linux

package recordlog_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/connectors/recordlog"
)

// TestFailedWriteIsCutBack: a write the file system refuses halfway (here
// the file size limit, as a full disk would) fails, leaves no half record
// behind, and the log takes the next write that fits. It runs in a child
// process: the limit is process-wide.
func TestFailedWriteIsCutBack(t *testing.T) {
	path := os.Getenv("RECORDLOG_FSIZE_CHILD")
	if path == "" {
		path = filepath.Join(t.TempDir(), "log.jsonl")
		cmd := exec.Command(os.Args[0], "-test.run=^TestFailedWriteIsCutBack$", "-test.v")
		cmd.Env = append(os.Environ(), "RECORDLOG_FSIZE_CHILD="+path)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS") {
			t.Fatalf("child: %v\n%s", err, out)
		}
		l := open(t, path, recordlog.Options{})
		if got := strings.Join(records(t, l), " "); got != `{"a":1} {"a":3}` {
			t.Fatalf("after the refused write the log holds %s", got)
		}
		return
	}
	signal.Ignore(syscall.SIGXFSZ)
	ctx := context.Background()
	l := open(t, path, recordlog.Options{})
	lim := &syscall.Rlimit{Cur: recordlog.HeaderSize + 100, Max: recordlog.HeaderSize + 100}
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, lim); err != nil {
		t.Skipf("setrlimit: %v", err)
	}
	if err := l.Write(ctx, [][]byte{[]byte(`{"a":1}`)}); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(path)
	// A batch of small records: what the file takes of it holds whole
	// lines, which must not outlive the failure.
	var batch [][]byte
	for i := range 20 {
		batch = append(batch, fmt.Appendf(nil, `{"b":%02d}`, i))
	}
	err := l.Write(ctx, batch)
	if err == nil || !errors.Is(err, syscall.EFBIG) {
		t.Fatalf("a write past the limit: %v", err)
	}
	if after, _ := os.Stat(path); after.Size() != before.Size() {
		t.Fatalf("the refused write left %d bytes", after.Size()-before.Size())
	}
	if err := l.Write(ctx, [][]byte{[]byte(`{"a":3}`)}); err != nil {
		t.Fatalf("the write after a refused one: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}
