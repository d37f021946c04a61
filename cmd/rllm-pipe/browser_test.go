package main

// Browser tests' harness: a headless Chromium (scripts/browser.sh installs
// Debian's package) driven over the DevTools Protocol with chromedp. Each
// page records its console errors, uncaught exceptions and every request.

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// browserPath finds Chromium, or skips (loudly) when there is none; with
// RLLM_REQUIRE_BROWSER=1 it fails instead.
func browserPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("RLLM_CHROMIUM"); p != "" {
		return p
	}
	for _, b := range []string{"chromium", "chromium-browser", "google-chrome-stable", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(b); err == nil {
			return p
		}
	}
	msg := "BROWSER TEST NOT RUN: no Chromium found (run scripts/browser.sh, or set RLLM_CHROMIUM)"
	if os.Getenv("RLLM_REQUIRE_BROWSER") == "1" {
		t.Fatal(msg)
	}
	t.Log(msg)
	t.Skip(msg)
	return ""
}

// page is one browser tab with what it saw.
type page struct {
	ctx context.Context

	mu       sync.Mutex
	errors   []string
	requests []string
}

// newPage starts a browser (closed at the end of the test) and one tab.
func newPage(t *testing.T) *page {
	t.Helper()
	exe := browserPath(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe),
		chromedp.NoSandbox,
		chromedp.WindowSize(1360, 1800),
		chromedp.UserDataDir(t.TempDir()),
	)
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	tctx, tcancel := context.WithTimeout(ctx, 3*time.Minute)
	t.Cleanup(func() {
		tcancel()
		cancel()
		acancel()
	})
	p := &page{ctx: tctx}
	if err := chromedp.Listen(ctx, func(ev any) {
		p.mu.Lock()
		defer p.mu.Unlock()
		switch e := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError || e.Type == runtime.ConsoleAPICalledTypeWarning {
				var parts []string
				for _, a := range e.Args {
					parts = append(parts, string(a.Value)+a.Description)
				}
				p.errors = append(p.errors, "console "+string(e.Type)+": "+strings.Join(parts, " "))
			}
		case *runtime.EventExceptionThrown:
			p.errors = append(p.errors, "exception: "+e.ExceptionDetails.Text)
		case *network.EventRequestWillBeSent:
			p.requests = append(p.requests, e.Request.URL)
		case *network.EventLoadingFailed:
			p.errors = append(p.errors, "loading failed: "+e.ErrorText)
		}
	}); err != nil {
		t.Fatalf("start Chromium %s: %v", exe, err)
	}
	// chromedp enables the network and runtime domains of a new tab.
	return p
}

func (p *page) seen() (errs, reqs []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.errors...), append([]string(nil), p.requests...)
}

// screenshot saves the whole page as a test artefact under
// $RLLM_ARTIFACTS (default $TMPDIR/rllm-pipe-artifacts) and returns its
// path.
func (p *page) screenshot(t *testing.T, name string) string {
	t.Helper()
	png, err := chromedp.Run(p.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	dir := os.Getenv("RLLM_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "rllm-pipe-artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, name)
	if err := os.WriteFile(out, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", out)
	return out
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](t *testing.T, p *page, expr string) T {
	t.Helper()
	v, err := chromedp.Run(p.ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// do runs actions, failing the test on an error.
func (p *page) do(t *testing.T, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(p.ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// colourScheme makes the page see prefers-color-scheme: scheme ("dark"
// or "light").
func (p *page) colourScheme(t *testing.T, scheme string) {
	t.Helper()
	p.do(t, "emulate "+scheme, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}}})
		return err
	}))
}
