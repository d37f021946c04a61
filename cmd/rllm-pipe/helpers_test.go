package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/kafka"
	"github.com/rllm-pipe/rllm-pipe/connectors/s3"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Helpers shared by the subprocess tests of consume, sql and export.

// s3Target is a fresh prefix in the test bucket of the MinIO that `make
// test` starts (the test is skipped without RLLM_PIPE_S3_ENDPOINT).
type s3Target struct {
	endpoint string
	url      string // s3://rllm-pipe-test/<name>-<random>
	id       string
}

func newS3Target(t *testing.T, name string) s3Target {
	t.Helper()
	endpoint := os.Getenv("RLLM_PIPE_S3_ENDPOINT")
	if endpoint == "" {
		t.Skip("RLLM_PIPE_S3_ENDPOINT not set: run `make test` (it starts MinIO)")
	}
	var rb [4]byte
	_, _ = rand.Read(rb[:])
	id := hex.EncodeToString(rb[:])
	tg := s3Target{endpoint: endpoint, url: "s3://rllm-pipe-test/" + name + "-" + id, id: id}
	cfg, err := s3.ParseURL(tg.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Endpoint = endpoint
	cleanupS3(t, cfg)
	return tg
}

// cleanupTopics deletes a test's topics when it ends and passed (kept, as
// cleanupS3 keeps objects, for a failed test or with RLLM_KEEP_TEST_DATA);
// a topic that was never created is skipped.
func cleanupTopics(t *testing.T, brokers string, topics ...string) {
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("RLLM_KEEP_TEST_DATA") != "" {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := kafka.DeleteTopics(ctx, kafka.Config{Brokers: strings.Split(brokers, ",")}, topics...); err != nil {
			t.Logf("cleanup of topics %v: %v", topics, err)
		}
	})
}

// cleanupS3 deletes a test's prefix when it ends and passed (a failed
// test keeps its objects for diagnosis, as every test does with
// RLLM_KEEP_TEST_DATA set), so runs do not pile up in a developer's MinIO.
func cleanupS3(t *testing.T, cfg s3.Config) {
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("RLLM_KEEP_TEST_DATA") != "" {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := s3.RemovePrefix(ctx, cfg); err != nil {
			t.Logf("cleanup of %s: %v", cfg, err)
		}
	})
}

// flags point a command at the endpoint.
func (s s3Target) flags() []string { return []string{"--s3-endpoint", s.endpoint} }

// open reads the prefix's manifest, for checks.
func (s s3Target) open(t *testing.T, reader string) *s3.Store {
	t.Helper()
	cfg, err := s3.ParseURL(s.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Endpoint = s.endpoint
	st, err := s3.Open(context.Background(), cfg, reader+"-"+s.id)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// ingestWithStats runs `rllm-pipe ingest args...` with env (nil: e2eEnv())
// and a --stats-json file in work, fails the test on a non-zero exit, and
// returns the run's stats.
func ingestWithStats(t *testing.T, bin, work string, env []string, args ...string) ingestStats {
	t.Helper()
	f, err := os.CreateTemp(work, "ingest-stats-*.json")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	full := append([]string{"ingest", "--stats-json", f.Name(), "--quiet"}, args...)
	r := sqlRun(t, bin, work, env, full...)
	if r.code != 0 {
		t.Fatalf("ingest %q: exit %d\n%s%s", args, r.code, r.stdout, r.stderr)
	}
	data, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	var st ingestStats
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatalf("%s: %v", f.Name(), err)
	}
	return st
}

var genTaskRE = regexp.MustCompile(`"task_id":"task-([0-9]+)"`)

// genTask is the task number of a line written by `rllm-pipe gen`
// ("task-000042" → 42), for tests that split generated input by task.
func genTask(t *testing.T, line []byte) int {
	t.Helper()
	m := genTaskRE.FindSubmatch(line)
	if m == nil {
		t.Fatalf("generated record without a task id: %s", e2eClip(string(line), 200))
	}
	n, err := strconv.Atoi(string(m[1]))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// mustEntries re-reads a store's manifest.
func mustEntries(t testing.TB, st interface {
	Entries(context.Context) ([]schemas.ShardEntry, error)
}) []schemas.ShardEntry {
	t.Helper()
	e, err := st.Entries(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return e
}
