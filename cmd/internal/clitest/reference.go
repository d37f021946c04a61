// Package clitest holds what the executables' tests share: the check that
// the command reference in docs/ is the commands' help as it is now.
package clitest

import (
	"flag"
	"os"
	"testing"

	"github.com/spf13/cobra"

	"github.com/rllm-pipe/rllm-pipe/cmd/internal/cli"
)

// updateDocs: `go test -run TestCLIReference -update-docs` (make docs)
// rewrites the reference instead of comparing it.
var updateDocs = flag.Bool("update-docs", false, "rewrite the command reference in docs/")

// CheckReference compares the reference of root with the file at path, or
// writes it there with -update-docs; for a test of each executable.
func CheckReference(t testing.TB, root *cobra.Command, title, path string) {
	t.Helper()
	want, err := cli.Reference(root, title)
	if err != nil {
		t.Fatal(err)
	}
	if *updateDocs {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != want {
		t.Fatalf("%s is not the commands' help as it is now (%v): run `make docs`", path, err)
	}
}
