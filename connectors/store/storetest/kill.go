//go:build unix

package storetest

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Reenter runs the test binary again, for the test named test only, with
// the environment variable env set to spec (the child sees it and plays
// the writer to be killed), and returns the child's output lines and
// whether it died of SIGKILL. A child that ends any other way but
// success fails t.
func Reenter(t testing.TB, test, env, spec string) (lines []string, killed bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env+"="+spec)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		ws, ok := ee.Sys().(syscall.WaitStatus)
		if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("%s (%s): the child failed on its own: %v\n%s%s", test, spec, err, stdout.String(), stderr.String())
		}
		killed = true
	case err != nil:
		t.Fatal(err)
	}
	return strings.Split(stdout.String(), "\n"), killed
}

// Acked returns the numbers of the lines "acked <n>" a child printed
// after each commit that returned.
func Acked(lines []string) []int {
	var out []int
	for _, line := range lines {
		if v, ok := strings.CutPrefix(line, "acked "); ok {
			if n, err := strconv.Atoi(v); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// Die kills the process with SIGKILL, as kill -9 would.
func Die() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}
