package compact

import (
	"context"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
)

// Every runs once without an interval, and with one runs until stop is
// closed, returning nil between runs.
func TestEvery(t *testing.T) {
	ctx := context.Background()
	r, err := local.OpenReader(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	if err := Every(ctx, r, Config{Writer: "c"}, 0, nil, func(Stats, time.Duration, error) { runs++ }); err != nil || runs != 1 {
		t.Fatalf("no interval: %d runs (%v), want 1", runs, err)
	}
	stop := make(chan struct{})
	runs = 0
	err = Every(ctx, r, Config{Writer: "c"}, time.Millisecond, stop, func(_ Stats, _ time.Duration, err error) {
		if err != nil {
			t.Errorf("run: %v", err)
		}
		if runs++; runs == 3 {
			close(stop)
		}
	})
	if err != nil || runs != 3 {
		t.Fatalf("until stopped: %d runs (%v), want 3 and nil", runs, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	err = Every(cctx, r, Config{Writer: "c"}, time.Hour, nil, func(Stats, time.Duration, error) { cancel() })
	if err != context.Canceled {
		t.Fatalf("cancelled between runs: %v, want context.Canceled", err)
	}
}
