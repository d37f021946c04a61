package s3

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/minio/minio-go/v7"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// listings records the prefixes of the object listings a client makes.
type listings struct {
	base     http.RoundTripper
	mu       sync.Mutex
	prefixes []string
}

func (l *listings) RoundTrip(r *http.Request) (*http.Response, error) {
	if q := r.URL.Query(); r.Method == http.MethodGet && q.Has("list-type") {
		l.mu.Lock()
		l.prefixes = append(l.prefixes, q.Get("prefix"))
		l.mu.Unlock()
	}
	return l.base.RoundTrip(r)
}

func (l *listings) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.prefixes
	l.prefixes = nil
	return out
}

// A long run claims at every Kafka rebalance and sweeps at the end of
// every generation: neither may list every object under the prefix each
// time (a month of shards). A claim lists only when there is a writer
// to clean up after (one fenced everywhere, not cleaned since its latest
// entry), and a sweep lists only this writer's names in the partitions it
// wrote to since its last sweep.
func TestIntegrationClaimsAndSweepsListOnlyWhatTheyNeed(t *testing.T) {
	cfg := testConfig(t)
	ctx := context.Background()
	base, err := minio.DefaultTransport(false)
	if err != nil {
		t.Fatal(err)
	}
	seen := &listings{base: base}
	counted := cfg
	counted.Transport = seen
	commit := func(s *Store, rel, stream string, pos int64) {
		t.Helper()
		p, err := s.Create(ctx, rel)
		if err != nil {
			t.Fatal(err)
		}
		p.Write([]byte("x"))
		if err := p.Commit(ctx, schemas.ShardEntry{Rows: 1, Settled: schemas.Settled{stream: {{pos, pos}}}}); err != nil {
			t.Fatal(err)
		}
	}
	a := open(t, cfg, "a-1")
	if err := a.Claim(ctx, []string{"topic/0"}, 1); err != nil {
		t.Fatal(err)
	}
	commit(a, "policy=0/part-a-1-000001.parquet", "topic/0", 0)
	orphan := a.key("policy=3/part-a-1-000002.parquet") // a dies mid-commit
	if err := a.putIfAbsent(ctx, orphan, bytes.NewReader([]byte("x")), 1, ""); err != nil {
		t.Fatal(err)
	}
	b, err := Open(ctx, counted, "b-1")
	if err != nil {
		t.Fatal(err)
	}
	seen.take()
	if err := b.Claim(ctx, []string{"topic/1"}, 1); err != nil {
		t.Fatal(err)
	}
	if got := seen.take(); len(got) != 0 {
		t.Fatalf("a claim with every other writer holding its claims listed %q", got)
	}
	// The rebalance moves topic/0 to b: a is fenced everywhere, and its
	// orphan goes.
	if err := b.Claim(ctx, []string{"topic/0", "topic/1"}, 2); err != nil {
		t.Fatal(err)
	}
	if got := seen.take(); len(got) == 0 {
		t.Fatal("the claim that fenced a dead writer did not look for its orphans")
	}
	if _, missing, err := b.get(ctx, orphan); err != nil || !missing {
		t.Fatalf("the dead writer's orphan: missing %v, %v", missing, err)
	}
	commit(b, "policy=1/part-b-1-000001.parquet", "topic/1", 0)
	if err := b.Claim(ctx, []string{"topic/0", "topic/1"}, 3); err != nil {
		t.Fatal(err)
	}
	if got := seen.take(); len(got) != 0 {
		t.Fatalf("a claim with nothing new to clean up listed %q", got)
	}
	// b's own orphan in the partition it wrote to; the sweep lists b's
	// names there and among the dead letters, nothing else.
	own := b.key("policy=1/part-b-1-000002.parquet")
	if err := b.putIfAbsent(ctx, own, bytes.NewReader([]byte("x")), 1, ""); err != nil {
		t.Fatal(err)
	}
	if err := b.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	got := seen.take()
	for _, p := range got {
		if !strings.Contains(p, "/part-b-1-") && !strings.HasSuffix(p, "_dlq/b-1-") {
			t.Fatalf("the sweep listed %q: not b-1's names", p)
		}
	}
	if len(got) != 2 {
		t.Fatalf("the sweep listed %q, want b-1's dead letters and partition policy=1", got)
	}
	if _, missing, err := b.get(ctx, own); err != nil || !missing {
		t.Fatalf("b's own orphan: missing %v, %v", missing, err)
	}
	// Nothing written since: the next sweep lists only the dead letters.
	if err := b.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if got := seen.take(); len(got) != 1 {
		t.Fatalf("a sweep after nothing was written listed %q", got)
	}
}

// TestEndpointCredentialsNotShown: an endpoint URL holding a user and
// password is refused, and neither appears in the error or in the
// configuration's description (both are logged).
func TestEndpointCredentialsNotShown(t *testing.T) {
	cfg := Config{Endpoint: "http://EPUSER:EPSECRETXYZ@127.0.0.1:1", Bucket: "b", Prefix: "p", Region: "us-east-1", AccessKey: "a", SecretKey: "b"}
	_, err := OpenReader(context.Background(), cfg, "t")
	if err == nil {
		t.Fatal("an endpoint with credentials was accepted")
	}
	for _, s := range []string{err.Error(), cfg.String()} {
		if strings.Contains(s, "EPSECRETXYZ") || strings.Contains(s, "EPUSER") {
			t.Errorf("the endpoint's credentials are shown: %s", s)
		}
	}
	if !strings.Contains(cfg.String(), "http://127.0.0.1:1") {
		t.Errorf("the endpoint is not described: %s", cfg.String())
	}
	for _, u := range []string{"http://127.0.0.1:1", "https://s3.us-east-1.amazonaws.com"} {
		if got := shownURL(u); got != u {
			t.Errorf("shownURL(%s) = %s", u, got)
		}
	}
	if got := shownURL("http://a b@%zz"); strings.Contains(got, "a b") {
		t.Errorf("an endpoint that does not parse is repeated: %s", got)
	}
	// Nor in the s3:// URL itself (they would not be used either).
	for _, u := range []string{"s3://KEYID:URLSECRETXYZ@bucket/prefix", "s3://KEYID:URLSECRETXYZ@/prefix", "s3://KEYID:URL SECRETXYZ@b%zz/p"} {
		_, err := ParseURL(u)
		if err == nil || strings.Contains(err.Error(), "SECRETXYZ") || strings.Contains(err.Error(), "KEYID") {
			t.Errorf("ParseURL(%s): %v; want an error without the credentials", u, err)
		}
	}
}
