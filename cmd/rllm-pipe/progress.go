package main

import (
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress shows a long command's progress on a terminal
// (schollz/progressbar): bytes against a total, or a count when the total
// is unknown (-1). On anything but a terminal, or with --quiet, it shows
// nothing.
type progress struct{ bar *progressbar.ProgressBar }

func newProgress(w io.Writer, label string, total int64, bytes, quiet bool) *progress {
	if quiet || !isTerminal(w) {
		return &progress{}
	}
	opts := []progressbar.Option{
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(label),
		progressbar.OptionThrottle(100 * time.Millisecond),
		progressbar.OptionShowElapsedTimeOnFinish(),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSetWidth(30),
		progressbar.OptionSetPredictTime(total > 0),
	}
	if bytes {
		opts = append(opts, progressbar.OptionShowBytes(true), progressbar.OptionShowCount())
	} else {
		opts = append(opts, progressbar.OptionShowCount(), progressbar.OptionSetItsString("records"), progressbar.OptionShowIts())
	}
	return &progress{bar: progressbar.NewOptions64(total, opts...)}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// set moves the bar to n (done of total, or the count).
func (p *progress) set(n int64) {
	if p.bar != nil {
		_ = p.bar.Set64(n)
	}
}

// follow sets the bar from value every 200 ms until stop (which may be
// called more than once) is called.
func (p *progress) follow(value func() int64) (stop func()) {
	if p.bar == nil {
		return func() {}
	}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				p.set(value())
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(quit)
			<-done
			p.finish()
		})
	}
}

// finish clears the bar.
func (p *progress) finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
		_ = p.bar.Clear()
	}
}

// update moves the bar to done of total (a progress callback).
func (p *progress) update(done, total int64) {
	if p.bar == nil {
		return
	}
	if total > 0 && p.bar.GetMax64() != total {
		p.bar.ChangeMax64(total)
	}
	p.set(done)
}

// countingWriter counts the bytes written through it (for progress).
type countingWriter struct {
	w io.Writer
	n atomic.Int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}
