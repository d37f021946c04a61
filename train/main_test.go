package train

import (
	"testing"

	"go.uber.org/goleak"
)

// Every consumer test of the package folds done shards into the low
// watermark (see fold_test.go), far more often than a run does.
func TestMain(m *testing.M) {
	foldEvery, foldMax = 2, 5
	goleak.VerifyTestMain(m)
}
