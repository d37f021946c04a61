package main

import (
	"context"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/cmd/internal/clitest"
)

// docs/cli-iceberg.md is every iceberg command's help as it is now (make
// docs).
func TestCLIReference(t *testing.T) {
	root := newRoot(context.Background())
	ice, _, err := root.Find([]string{"iceberg"})
	if err != nil {
		t.Fatal(err)
	}
	clitest.CheckReference(t, ice, "rllm-pipe iceberg command reference", "../../docs/cli-iceberg.md")
}
