package live

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// growingManifest is a store whose manifest gains an entry at every
// read, as under a steady stream of commits.
type growingManifest struct {
	store.Reader
	mu      sync.Mutex
	entries []schemas.ShardEntry
	frozen  bool
}

func (g *growingManifest) Name() string { return "growing" }

func (g *growingManifest) Entries(context.Context) ([]schemas.ShardEntry, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.frozen {
		g.entries = append(g.entries, schemas.ShardEntry{Path: fmt.Sprintf("s%d", len(g.entries))})
	}
	return append([]schemas.ShardEntry(nil), g.entries...), nil
}

func (g *growingManifest) freeze() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.frozen = true
	return len(g.entries)
}

// TestRunSpacesRebuilds: with a commit at every poll and a rebuild that
// takes at least 100 ms, Run starts a rebuild no sooner than 4 of the
// last one's durations after it ended (so 500 ms apart at least), not at
// every poll; the state says what is pending meanwhile; once commits
// stop it catches up.
func TestRunSpacesRebuilds(t *testing.T) {
	const build = 100 * time.Millisecond
	m := &growingManifest{}
	s := New(m, Options{Poll: 10 * time.Millisecond})
	dir := t.TempDir()
	var mu sync.Mutex
	var opened []time.Time
	s.open = func(ctx context.Context) (*duckdb.DB, error) {
		mu.Lock()
		opened = append(opened, time.Now())
		mu.Unlock()
		time.Sleep(build)
		return duckdb.OpenLocal(ctx, dir, duckdb.Options{})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(opened)
		mu.Unlock()
		if n >= 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rebuilds in 30 s", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	for i := 1; i < len(opened); i++ {
		if gap := opened[i].Sub(opened[i-1]); gap < 5*build {
			t.Errorf("rebuild %d started %s after the one before, want at least %s (a rebuild and 4 times its duration)", i, gap, 5*build)
		}
	}
	mu.Unlock()
	// Between rebuilds the state shows entries pending.
	deadline = time.Now().Add(10 * time.Second)
	for {
		s.mu.RLock()
		pending, last := s.pending, s.lastBuild
		s.mu.RUnlock()
		if pending > 0 && last >= build {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pending %d, last rebuild %s: want entries pending and the rebuild's duration", pending, last)
		}
		time.Sleep(5 * time.Millisecond)
	}
	n := m.freeze()
	deadline = time.Now().Add(30 * time.Second)
	for {
		_, entries, _, _ := s.snapshot()
		if len(entries) == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d entries shown 30 s after the commits stopped", len(entries), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestBuildingPage: before the first build ends the index answers 503
// with Retry-After and a page that says what is being built (and the
// error of a failed attempt); afterwards the charts.
func TestBuildingPage(t *testing.T) {
	m := &growingManifest{}
	m.freeze()
	s := New(m, Options{Poll: time.Hour})
	release := make(chan struct{})
	fail := errors.New("shard s0 unreadable")
	attempt := 0
	s.open = func(ctx context.Context) (*duckdb.DB, error) {
		attempt++
		if attempt == 1 {
			return nil, fail
		}
		<-release
		return duckdb.OpenLocal(ctx, t.TempDir(), duckdb.Options{})
	}
	h := s.Handler()
	get := func() *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		return rec
	}
	if rec := get(); rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" ||
		!strings.Contains(rec.Body.String(), "Reading the manifest of growing") {
		t.Fatalf("before any build: %d %q", rec.Code, rec.Body.String())
	}
	if err := s.Refresh(context.Background()); !errors.Is(err, fail) {
		t.Fatalf("first refresh: %v", err)
	}
	if rec := get(); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "shard s0 unreadable") {
		t.Fatalf("after a failed build: %d %q", rec.Code, rec.Body.String())
	}
	done := make(chan error, 1)
	go func() { done <- s.Refresh(context.Background()) }()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(get().Body.String(), "Building the views of growing: 0 manifest entries") {
		if time.Now().After(deadline) {
			t.Fatalf("no building page during the build: %q", get().Body.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if rec := get(); rec.Code != http.StatusOK || strings.Contains(rec.Body.String(), "Building") {
		t.Fatalf("after the build: %d", rec.Code)
	}
	s.Close()
}
