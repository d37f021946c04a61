package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/rllm-pipe/rllm-pipe/connectors/iceberg/syncresult"
)

// icebergExe is the executable that syncs Iceberg tables
// (cmd/rllm-pipe-iceberg): rllm-pipe runs it, so that its own start-up
// skips iceberg-go's package initialisation.
const icebergExe = "rllm-pipe-iceberg"

// newIcebergCmd runs rllm-pipe-iceberg with the arguments as given: its
// help is the command's help.
func newIcebergCmd(context.Context) *cobra.Command {
	return &cobra.Command{
		Use:                "iceberg",
		Short:              "Project committed shards into Apache Iceberg tables (Spark, Trino, pyiceberg)",
		Long:               "iceberg runs " + icebergExe + " (installed beside rllm-pipe): rllm-pipe iceberg sync --help says more.",
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			exe, err := icebergPath()
			if err != nil {
				return err
			}
			return execIceberg(exe, args)
		},
	}
}

// icebergPath finds rllm-pipe-iceberg: $RLLM_PIPE_ICEBERG_BIN, else
// beside this executable, else on PATH.
func icebergPath() (string, error) {
	if p := os.Getenv("RLLM_PIPE_ICEBERG_BIN"); p != "" {
		return p, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), icebergExe)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	if p, err := exec.LookPath(icebergExe); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("iceberg: %s is neither beside this rllm-pipe nor on PATH (nor in $RLLM_PIPE_ICEBERG_BIN): build it with `make build`, or go build -o DIR ./cmd/%s with DIR rllm-pipe's folder", icebergExe, icebergExe)
}

// icebergTarget is where ingest's --iceberg-* project the output root.
type icebergTarget struct {
	catalog, name, namespace, warehouse string
}

// icebergTotals is what a run's syncs did in all (the JSON lines of
// rllm-pipe-iceberg sync --json, summed), for ingest's summary.
type icebergTotals = syncresult.Result

// icebergFollower is `rllm-pipe-iceberg sync --follow` keeping a table in
// step with a running ingest, as a child process.
type icebergFollower struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the child has exited and its output is read
	err  error         // its exit, once done

	mu      sync.Mutex
	totals  icebergTotals
	lastErr string // the last line it wrote on stderr
}

// icebergStartWait bounds how long ingest waits for the catalog to open.
const icebergStartWait = time.Minute

// finishTimeout bounds ingest's wait for the last sync (the child's own
// bound, and a margin).
const finishTimeout = 2*time.Minute + 10*time.Second

// startIceberg starts the follower of root (ingest's --to) and waits
// until it has opened the catalog. An error of the command line is a
// usage error (exit code 2); any other means the catalog cannot be used
// now.
func startIceberg(ctx context.Context, root string, conn connFlags, t icebergTarget, every time.Duration, log *slog.Logger) (*icebergFollower, error) {
	exe, err := icebergPath()
	if err != nil {
		return nil, usageErrorf("--iceberg-catalog: %v", err)
	}
	dir, err := os.MkdirTemp("", "rllm-pipe-iceberg-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	ready := filepath.Join(dir, "ready")
	args := []string{"sync", "--from", root, "--catalog", t.catalog, "--follow", "--poll", every.String(), "--json", "--quiet", "--ready-file", ready}
	for _, a := range [][2]string{{"--catalog-name", t.name}, {"--namespace", t.namespace}, {"--warehouse", t.warehouse}} {
		if a[1] != "" { // unset: rllm-pipe-iceberg's default
			args = append(args, a[0], a[1])
		}
	}
	args = append(args, conn.Args()...)
	f := &icebergFollower{cmd: exec.Command(exe, args...), done: make(chan struct{})}
	f.cmd.SysProcAttr = childAttrs()
	stdout, err := f.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := f.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := f.cmd.Start(); err != nil {
		return nil, fmt.Errorf("iceberg: starting %s: %w", exe, err)
	}
	var read sync.WaitGroup
	read.Add(2)
	go func() {
		defer read.Done()
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var r icebergTotals
			if json.Unmarshal(sc.Bytes(), &r) != nil {
				continue
			}
			f.mu.Lock()
			f.totals.Add(r)
			f.mu.Unlock()
		}
	}()
	go func() {
		defer read.Done()
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := string(bytes.TrimSpace(sc.Bytes()))
			if line == "" {
				continue
			}
			log.Warn("iceberg: " + line)
			f.mu.Lock()
			f.lastErr = line
			f.mu.Unlock()
		}
	}()
	go func() {
		read.Wait()
		f.err = f.cmd.Wait()
		close(f.done)
	}()
	deadline := time.NewTimer(icebergStartWait)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(ready); err == nil {
			return f, nil
		}
		select {
		case <-f.done:
			err := f.exitError()
			var ee *exec.ExitError
			if errors.As(err, &ee) && ee.ExitCode() == exitUsage {
				return nil, usageErrorf("--iceberg-*: %v", err)
			}
			return nil, err
		case <-ctx.Done():
			f.halt()
			return nil, ctx.Err()
		case <-deadline.C:
			f.halt()
			return nil, fmt.Errorf("iceberg: the catalog did not open within %s", icebergStartWait)
		case <-tick.C:
		}
	}
}

// exitError is the child's exit as an error (nil for a clean exit),
// with the last line it wrote; f.done must be closed.
func (f *icebergFollower) exitError() error {
	if f.err == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lastErr != "" {
		return fmt.Errorf("%s: %w: %s", icebergExe, f.err, f.lastErr)
	}
	return fmt.Errorf("%s: %w", icebergExe, f.err)
}

// finish asks the follower for its last sync (SIGTERM: it syncs once
// more and exits) and returns what its syncs did in all.
func (f *icebergFollower) finish(ctx context.Context) (icebergTotals, error) {
	_ = f.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(finishTimeout)
	defer t.Stop()
	var err error
	select {
	case <-f.done:
		err = f.exitError()
	case <-ctx.Done():
		f.halt()
		err = ctx.Err()
	case <-t.C:
		f.halt()
		err = fmt.Errorf("iceberg: the last sync did not end within %s", finishTimeout)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.totals, err
}

// halt stops the follower where it is (SIGKILL: every step of a sync is
// safe to stop at) and waits for it.
func (f *icebergFollower) halt() {
	select {
	case <-f.done:
		return
	default:
	}
	_ = f.cmd.Process.Kill()
	<-f.done
}
