package gatewayout

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/rllm-pipe/rllm-pipe/connectors"
	"github.com/rllm-pipe/rllm-pipe/ingest/gateway"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestKindOf(t *testing.T) {
	for _, tc := range []struct {
		to   string
		want Kind
	}{
		{"kafka://127.0.0.1:9092/steps", KindKafka},
		{"./traces.jsonl", KindRecordLog},
		{"/data/traces.jsonl", KindRecordLog},
		{"./data", KindShardRoot},
		{"s3://bucket/prefix", KindShardRoot},
		{"s3://bucket/x.jsonl", KindShardRoot},
	} {
		if got := KindOf(tc.to); got != tc.want {
			t.Errorf("%s: kind %d, want %d", tc.to, got, tc.want)
		}
	}
}

// A record log output: what Write returned nil for is in the file, whole
// lines, after Close.
func TestRecordLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "traces.jsonl")
	out, err := Open(context.Background(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	recs := []gateway.Record{{Key: "a", Line: []byte(`{"type":"step","n":1}`)}, {Key: "b", Line: []byte(`{"type":"trajectory","n":2}`)}}
	if err := out.Write(context.Background(), recs); err != nil {
		t.Fatal(err)
	}
	if out.Failed() != nil || out.Err() != nil || out.String() != path || !strings.Contains(out.Summary(), path) {
		t.Fatalf("%s: %s", out.String(), out.Summary())
	}
	// A record the log cannot take is the gateway's RefusedError, naming
	// it: the gateway writes its stub instead of retrying for ever.
	long := []byte(`{"x":"` + strings.Repeat("a", out.MaxRecordBytes()) + `"}`)
	err = out.Write(context.Background(), []gateway.Record{recs[0], {Key: "c", Line: long}})
	var re *gateway.RefusedError
	if !errors.As(err, &re) || re.Index != 1 || re.Reason != "too_large" {
		t.Fatalf("a record over MaxRecordBytes (%d): %v", out.MaxRecordBytes(), err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range bytes.Split(b, []byte{'\n'}) {
		if l = bytes.TrimSpace(l); len(l) > 0 {
			got = append(got, string(l))
		}
	}
	if len(got) != 2 || got[0] != string(recs[0].Line) || got[1] != string(recs[1].Line) {
		t.Fatalf("log holds %q", got)
	}
}

func TestWALDir(t *testing.T) {
	local, err := connectors.ParseRoot("/data/root", connectors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := WALDir("/data/root", local, ""); err != nil || d != filepath.Join("/data/root", "_gateway") {
		t.Fatalf("local: %q %v", d, err)
	}
	if _, err := WALDir("/data/root", local, "/tmp/wal"); !errors.Is(err, ErrUsage) {
		t.Fatalf("local with a wal dir: %v, want a usage error", err)
	}
	remote, err := connectors.ParseRoot("s3://bucket/prefix", connectors.Options{S3Endpoint: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := WALDir("s3://bucket/prefix", remote, "/tmp/wal"); err != nil || d != "/tmp/wal" {
		t.Fatalf("s3 with a wal dir: %q %v", d, err)
	}
	t.Setenv("XDG_CACHE_HOME", "/cache")
	a, err := WALDir("s3://bucket/prefix", remote, "")
	if err != nil || !strings.HasPrefix(a, filepath.Join("/cache", "rllm-pipe", "gateway")+string(filepath.Separator)) {
		t.Fatalf("s3 default: %q %v", a, err)
	}
	if b, _ := WALDir("s3://bucket/other", remote, ""); b == a {
		t.Fatalf("two targets share a write-ahead log: %s", a)
	}
	if _, err := Open(context.Background(), "kafka://", Options{}); !errors.Is(err, ErrUsage) {
		t.Fatalf("bad kafka url: %v, want a usage error", err)
	}
}
