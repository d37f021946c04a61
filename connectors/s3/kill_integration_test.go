//go:build unix

package s3

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"golang.org/x/sync/errgroup"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/connectors/store/storetest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// killChildEnv carries a killChild's settings into the re-entered test
// binary.
const killChildEnv = "RLLM_S3_KILL_CHILD"

// killChild is what one writer process of TestIntegrationManifestKilledAtEveryStep
// does: open, claim stream "f", commit shards 1..Shards settling position
// i, with snapshots every 4 entries in segments of 4, and kill itself
// with SIGKILL at manifest request At (counting the PUTs and DELETEs
// under _manifest/), before the request is sent or after its answer came
// back (After). At 0 it runs to the end and reports the requests it made.
type killChild struct {
	Endpoint, Bucket, Prefix string
	Shards                   int
	At                       int64
	After                    bool
	Pairs                    bool // shards committed two at once (group commit)
}

// killer is the child's HTTP transport: it counts the manifest's
// mutating requests and kills the process at the chosen one.
type killer struct {
	base  http.RoundTripper
	at    int64
	after bool
	n     atomic.Int64
}

func (k *killer) RoundTrip(r *http.Request) (*http.Response, error) {
	step := int64(0)
	if (r.Method == http.MethodPut || r.Method == http.MethodDelete) && strings.Contains(r.URL.Path, "/"+store.ManifestDir+"/") {
		step = k.n.Add(1)
	}
	if step > 0 && step == k.at && !k.after {
		storetest.Die()
	}
	resp, err := k.base.RoundTrip(r)
	if step > 0 && step == k.at && k.after {
		storetest.Die() // the request landed (or failed); the writer never learns which
	}
	return resp, err
}

// linger makes the two shards of a pair share a record.
func linger(pairs bool) time.Duration {
	if pairs {
		return 100 * time.Millisecond
	}
	return 0
}

func runKillChild(spec string) error {
	var c killChild
	if err := json.Unmarshal([]byte(spec), &c); err != nil {
		return err
	}
	base, err := minio.DefaultTransport(false)
	if err != nil {
		return err
	}
	k := &killer{base: base, at: c.At, after: c.After}
	cfg := Config{Endpoint: c.Endpoint, Bucket: c.Bucket, Prefix: c.Prefix, AccessKey: os.Getenv("AWS_ACCESS_KEY_ID"), SecretKey: os.Getenv("AWS_SECRET_ACCESS_KEY"),
		Region: "us-east-1", SnapshotEvery: 4, SegmentSize: 4, RetryFor: 20 * time.Second, Transport: k, Linger: linger(c.Pairs)}
	ctx := context.Background()
	s, err := Open(ctx, cfg, "w1")
	if err != nil {
		return err
	}
	if err := s.Claim(ctx, []string{"f"}, 0); err != nil {
		return err
	}
	out := bufio.NewWriter(os.Stdout)
	commit := func(i int) error {
		rel := fmt.Sprintf("policy=0/part-w1-%06d.parquet", i)
		p, err := s.Create(ctx, rel)
		if err != nil {
			return err
		}
		fmt.Fprintf(p, "shard %d", i)
		return p.Commit(ctx, schemas.ShardEntry{Rows: 1, Settled: schemas.Settled{"f": {{int64(i), int64(i)}}}})
	}
	step := 1
	if c.Pairs {
		step = 2
	}
	for i := 1; i <= c.Shards; i += step {
		var g errgroup.Group
		for j := i; j < i+step && j <= c.Shards; j++ {
			g.Go(func() error { return commit(j) })
		}
		if err := g.Wait(); err != nil {
			return err
		}
		for j := i; j < i+step && j <= c.Shards; j++ {
			fmt.Fprintf(out, "acked %d\n", j) // only after Commit returned
		}
		out.Flush()
	}
	fmt.Fprintf(out, "steps %d\n", k.n.Load())
	return out.Flush()
}

// A writer of an S3 manifest is killed with SIGKILL at every step of its
// protocol: each create-only append, each sealed segment, each snapshot
// and each delete of a compaction, before the request goes out and after
// its answer came back. After each death the manifest opens (as a reader
// and as the next writer), lists every shard whose commit was
// acknowledged, exactly once and in commit order, and nothing that was not
// committed; the next writer resumes from the settled positions, commits
// exactly the shards that are missing, snapshots and compacts on (the
// records below the second newest snapshot are gone again), and the
// result is every shard once.
func TestIntegrationManifestKilledAtEveryStep(t *testing.T) {
	if spec := os.Getenv(killChildEnv); spec != "" {
		if err := runKillChild(spec); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Run("direct", func(t *testing.T) { manifestKilledAtEveryStep(t, 12, false) })
	// Group commit: two shards committed at once share a record.
	t.Run("pairs", func(t *testing.T) { manifestKilledAtEveryStep(t, 12, true) })
}

func manifestKilledAtEveryStep(t *testing.T, shards int, pairs bool) {
	base := testConfig(t)
	run := func(at int64, after bool, prefix string) (acked []int, steps int64, killed bool) {
		t.Helper()
		spec, _ := json.Marshal(killChild{Endpoint: base.Endpoint, Bucket: base.Bucket, Prefix: prefix, Shards: shards, At: at, After: after, Pairs: pairs})
		lines, killed := storetest.Reenter(t, "TestIntegrationManifestKilledAtEveryStep", killChildEnv, string(spec))
		for _, line := range lines {
			if v, ok := strings.CutPrefix(line, "steps "); ok {
				steps, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		return storetest.Acked(lines), steps, killed
	}
	whole := base
	whole.Prefix += "/whole"
	acked, steps, killed := run(0, false, whole.Prefix)
	least := int64(3 * shards / 2) // a record and, every 4, a segment and a snapshot
	if pairs {
		least = int64(shards / 2) // a record a pair
	}
	if killed || len(acked) != shards || steps < least {
		t.Fatalf("the run without a kill: acked %d of %d shards in %d manifest steps (killed %v)", len(acked), shards, steps, killed)
	}
	t.Logf("a writer of %d shards makes %d manifest requests; killing it before and after each", shards, steps)
	for at := int64(1); at <= steps; at++ {
		for _, after := range []bool{false, true} {
			cfg := base
			cfg.Prefix = fmt.Sprintf("%s/k%03d-%v", base.Prefix, at, after)
			acked, _, killed := run(at, after, cfg.Prefix)
			if !killed {
				t.Fatalf("step %d (after %v): the writer was not killed", at, after)
			}
			inFlight := 1
			if pairs {
				inFlight = 2
			}
			checkAfterKill(t, cfg, fmt.Sprintf("step %d (after %v)", at, after), acked, shards, inFlight)
		}
	}
}

// checkAfterKill checks the manifest a killed writer left, resumes it
// with a second writer, and checks the result.
func checkAfterKill(t *testing.T, cfg Config, step string, acked []int, shards, inFlight int) {
	t.Helper()
	ctx := context.Background()
	cfg.SnapshotEvery, cfg.SegmentSize = 4, 4
	listed := func() []int {
		r, err := OpenReader(ctx, cfg, "reader")
		if err != nil {
			t.Fatalf("%s: open a reader: %v", step, err)
		}
		es, err := r.Committed(ctx)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		var out []int
		for _, e := range es {
			if _, err := r.cli.StatObject(ctx, cfg.Bucket, r.key(e.Path), minio.StatObjectOptions{}); err != nil {
				t.Fatalf("%s: listed shard %s: %v", step, e.Path, err)
			}
			digits, _ := strings.CutSuffix(e.Path[strings.LastIndexByte(e.Path, '-')+1:], ".parquet")
			i, err := strconv.Atoi(digits)
			if err != nil {
				t.Fatalf("%s: unexpected path %s", step, e.Path)
			}
			out = append(out, i)
		}
		return out
	}
	got := listed()
	// Each once, in commit order (shards committed at once in either
	// order), every acknowledged one, and nothing past the shards being
	// committed when the writer died.
	inOrder := slices.Clone(got)
	for j := 0; j+inFlight <= len(inOrder); j += inFlight {
		slices.Sort(inOrder[j : j+inFlight])
	}
	for j := 1; j < len(inOrder); j++ {
		if inOrder[j] <= inOrder[j-1] {
			t.Fatalf("%s: the manifest lists %v: not each shard once in commit order", step, got)
		}
	}
	sorted := slices.Sorted(slices.Values(got))
	if len(got) < len(acked) || len(got) > len(acked)+inFlight || !slices.Equal(sorted[:len(acked)], acked) {
		t.Fatalf("%s: acknowledged %v, the manifest lists %v", step, acked, got)
	}
	// The next writer resumes: the settled positions are exactly the
	// listed shards, and it commits the rest, then more (at least one
	// snapshot of its own).
	w, err := Open(ctx, cfg, "w2")
	if err != nil {
		t.Fatalf("%s: open the next writer: %v", step, err)
	}
	if err := w.Claim(ctx, []string{"f"}, 0); err != nil {
		t.Fatalf("%s: claim: %v", step, err)
	}
	settled := w.Settled()["f"]
	const more = 8
	for i := 1; i <= shards+more; i++ {
		done := settled.Contains(int64(i))
		if done != slices.Contains(got, i) {
			t.Fatalf("%s: position %d settled %v, listed %v", step, i, done, slices.Contains(got, i))
		}
		if done {
			continue
		}
		p, err := w.Create(ctx, fmt.Sprintf("policy=0/part-w2-%06d.parquet", i))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(p, "shard %d", i)
		if err := p.Commit(ctx, schemas.ShardEntry{Rows: 1, Settled: schemas.Settled{"f": {{int64(i), int64(i)}}}}); err != nil {
			t.Fatalf("%s: resume shard %d: %v", step, i, err)
		}
	}
	all := listed()
	slices.Sort(all)
	if n := shards + more; len(all) != n || all[0] != 1 || all[n-1] != n || len(slices.Compact(all)) != n {
		t.Fatalf("%s: after the resume the manifest lists %v, want 1..%d once each", step, all, n)
	}
	// Compaction went on past whatever the dead writer left half done.
	names, err := w.manifest.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var snaps, records []int64
	for _, n := range names {
		if s, ok := store.ParseNumbered(n, "snap-"); ok {
			snaps = append(snaps, s)
		} else if s, ok := store.ParseNumbered(n, ""); ok {
			records = append(records, s)
		}
	}
	if len(snaps) != 2 || len(records) == 0 || records[0] < snaps[0] {
		t.Fatalf("%s: after the resume the manifest holds snapshots %v and records %v: want the two newest snapshots and no record below the older", step, snaps, records)
	}
}
