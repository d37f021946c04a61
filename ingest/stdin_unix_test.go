//go:build unix

package ingest

import (
	"context"
	"errors"
	"io"
	"os"
	"testing"
	"time"
)

// TestStopWakesAQuietPipe: Stop ends a source blocked on a quiet pipe at
// once, and hands out everything read before it, a line cut short
// included; nothing after it is read.
func TestStopWakesAQuietPipe(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	s := openStoppable(r, 0)
	defer s.Close()
	if s.interrupt == nil {
		t.Fatal("a pipe is not read through the poller: Stop could not wake a blocked read")
	}
	if _, err := w.WriteString("{\"a\":1}\n{\"b\":2}\n{\"cut"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Read blocks on the quiet pipe, in the middle of the cut line.
	type result struct {
		got []string
		err error
	}
	res := make(chan result, 1)
	go func() {
		var got []string
		for {
			c, err := s.Read(ctx)
			c.Split()
			for _, r := range c.Records {
				got = append(got, string(r.Data))
			}
			if err != nil {
				res <- result{got, err}
				return
			}
		}
	}()
	time.Sleep(200 * time.Millisecond)
	s.Stop()
	var rr result
	select {
	case rr = <-res:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop did not wake the read blocked on a quiet pipe")
	}
	if !errors.Is(rr.err, io.EOF) {
		t.Fatalf("read: %v, want io.EOF after Stop", rr.err)
	}
	got := rr.got
	if want := []string{`{"a":1}`, `{"b":2}`, `{"cut`}; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("records %q, want %q", got, want)
	}
	// Written after the stop: never read.
	w.WriteString("{\"late\":1}\n")
	if _, err := s.Read(ctx); !errors.Is(err, io.EOF) {
		t.Fatalf("read after Stop: %v, want io.EOF", err)
	}
}
