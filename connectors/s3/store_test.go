package s3

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/connectors/store/storetest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// testConfig points at the MinIO that `make test` starts
// (scripts/services.sh); without it the integration tier is skipped here
// and runs in CI.
func testConfig(t testing.TB) Config {
	t.Helper()
	ep := os.Getenv("RLLM_PIPE_S3_ENDPOINT")
	if ep == "" {
		t.Skip("RLLM_PIPE_S3_ENDPOINT not set: run `make test` (it starts MinIO)")
	}
	var b [4]byte
	rand.Read(b[:])
	cfg, err := ParseURL("s3://rllm-pipe-test/" + strings.ReplaceAll(t.Name(), "/", "-") + "-" + hex.EncodeToString(b[:]))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Endpoint = ep
	cleanupPrefix(t, cfg)
	return cfg
}

// cleanupPrefix deletes the test's objects when it ends and passed (a
// failed test keeps them for diagnosis, as every test does with
// RLLM_KEEP_TEST_DATA set), so runs do not pile up in a developer's MinIO.
func cleanupPrefix(t testing.TB, cfg Config) {
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("RLLM_KEEP_TEST_DATA") != "" {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := RemovePrefix(ctx, cfg); err != nil {
			t.Logf("cleanup of %s: %v", cfg, err)
		}
	})
}

func open(t *testing.T, cfg Config, writer string) *Store {
	t.Helper()
	s, err := Open(context.Background(), cfg, writer)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// raceCreateOnly has n goroutines PUT body(i) create-only at key at once
// and returns how many won; any error but "exists" fails the test.
func raceCreateOnly(t *testing.T, s *Store, key string, n int, body func(i int) []byte) int {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := body(i)
			errs[i] = s.putIfAbsent(context.Background(), s.key(key), bytes.NewReader(b), int64(len(b)), "")
		}()
	}
	wg.Wait()
	wins := 0
	for _, err := range errs {
		switch {
		case err == nil:
			wins++
		case !errors.Is(err, errExists):
			t.Fatalf("unexpected error: %v", err)
		}
	}
	return wins
}

func TestIntegrationCreateOnlyRace(t *testing.T) {
	s := open(t, testConfig(t), "w")
	if wins := raceCreateOnly(t, s, "race/obj", 16, func(i int) []byte { return []byte(fmt.Sprintf("writer %d", i)) }); wins != 1 {
		t.Fatalf("%d create-only PUTs won, want exactly 1", wins)
	}
}

func TestIntegrationCASWithStaleETagFails(t *testing.T) {
	cfg := testConfig(t)
	s := open(t, cfg, "w")
	ctx := context.Background()
	info, err := s.cli.PutObject(ctx, cfg.Bucket, s.key("cas"), bytes.NewReader([]byte("v1")), 2, minio.PutObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stale := info.ETag
	o := minio.PutObjectOptions{}
	o.SetMatchETag(stale)
	if _, err := s.cli.PutObject(ctx, cfg.Bucket, s.key("cas"), bytes.NewReader([]byte("v2")), 2, o); err != nil {
		t.Fatalf("CAS with the current ETag failed: %v", err)
	}
	if _, err := s.cli.PutObject(ctx, cfg.Bucket, s.key("cas"), bytes.NewReader([]byte("v3")), 2, o); err == nil {
		t.Fatal("CAS with a stale ETag succeeded")
	}
}

func TestIntegrationManifestLogIsLinear(t *testing.T) {
	cfg := testConfig(t)
	const writers, each = 6, 5
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := Open(context.Background(), cfg, fmt.Sprintf("w%d", w))
			if err != nil {
				t.Error(err)
				return
			}
			for i := range each {
				e := schemas.ShardEntry{Settled: schemas.Settled{fmt.Sprintf("stream-%d", w): {{int64(i), int64(i)}}}}
				if err := s.Append(context.Background(), e); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	s := open(t, cfg, "reader")
	entries, err := s.Entries(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != writers*each {
		t.Fatalf("%d entries, want %d", len(entries), writers*each)
	}
	for i, e := range entries {
		if e.Seq != int64(i) {
			t.Fatalf("entry %d has seq %d", i, e.Seq)
		}
	}
	for w := range writers {
		if got := s.Settled()[fmt.Sprintf("stream-%d", w)].Len(); got != each {
			t.Fatalf("stream %d: %d positions settled", w, got)
		}
	}
}

func TestIntegrationZombieIsFenced(t *testing.T) {
	cfg := testConfig(t)
	ctx := context.Background()
	a := open(t, cfg, "zombie")
	if err := a.Claim(ctx, []string{"topic/0", "topic/1"}, 1); err != nil {
		t.Fatal(err)
	}
	// b takes partition 0 over while a still runs.
	b := open(t, cfg, "heir")
	if err := b.Claim(ctx, []string{"topic/0"}, 2); err != nil {
		t.Fatal(err)
	}
	// a's shard settles partition 0: it must be refused, and its upload
	// must not stay behind.
	p, err := a.Create(ctx, "policy=0/part-zombie-000001.parquet")
	if err != nil {
		t.Fatal(err)
	}
	p.Write([]byte("not really parquet"))
	err = p.Commit(ctx, schemas.ShardEntry{Settled: schemas.Settled{"topic/0": {{0, 9}}}})
	if !errors.Is(err, ErrFenced) {
		t.Fatalf("zombie commit: %v, want ErrFenced", err)
	}
	if _, err := a.cli.StatObject(ctx, cfg.Bucket, a.key("policy=0/part-zombie-000001.parquet"), minio.StatObjectOptions{}); err == nil {
		t.Fatal("fenced shard left in the bucket")
	}
	// a may still settle partition 1, which it holds.
	if err := a.Append(ctx, schemas.ShardEntry{Settled: schemas.Settled{"topic/1": {{0, 3}}}}); err != nil {
		t.Fatalf("commit on a held partition: %v", err)
	}
	// b settles partition 0.
	if err := b.Append(ctx, schemas.ShardEntry{Settled: schemas.Settled{"topic/0": {{0, 9}}}}); err != nil {
		t.Fatal(err)
	}
	// A claim from an older generation, landing late, cannot take the
	// partition back.
	if err := a.Claim(ctx, []string{"topic/0"}, 1); !errors.Is(err, ErrFenced) {
		t.Fatalf("stale claim: %v, want ErrFenced", err)
	}
	if err := b.Append(ctx, schemas.ShardEntry{Settled: schemas.Settled{"topic/0": {{10, 19}}}}); err != nil {
		t.Fatalf("owner fenced by a stale claim: %v", err)
	}
}

func TestIntegrationOwnOrphansSwept(t *testing.T) {
	cfg := testConfig(t)
	ctx := context.Background()
	w := open(t, cfg, "w-1")
	if err := w.Claim(ctx, []string{"topic/0"}, 1); err != nil {
		t.Fatal(err)
	}
	p, err := w.Create(ctx, "policy=0/part-w-1-000001.parquet")
	if err != nil {
		t.Fatal(err)
	}
	p.Write([]byte("listed"))
	if err := p.Commit(ctx, schemas.ShardEntry{Settled: schemas.Settled{"topic/0": {{0, 1}}}}); err != nil {
		t.Fatal(err)
	}
	// The upload carried a CRC32C of its body (the body is not signed).
	info, err := w.cli.StatObject(ctx, cfg.Bucket, w.key("policy=0/part-w-1-000001.parquet"), minio.StatObjectOptions{Checksum: true})
	if err != nil || info.ChecksumCRC32C != "m9aspQ==" {
		t.Fatalf("shard checksum %q (%v), want the CRC32C of its body", info.ChecksumCRC32C, err)
	}
	// An upload whose entry never landed (a commit cut short).
	if err := w.putIfAbsent(ctx, w.key("policy=0/part-w-1-000002.parquet"), bytes.NewReader([]byte("x")), 1, ""); err != nil {
		t.Fatal(err)
	}
	other := open(t, cfg, "w-2")
	if removed, _ := other.RemoveOrphans(ctx); len(removed) != 0 {
		t.Fatalf("another writer removed a live writer's objects: %v", removed)
	}
	removed, err := w.RemoveOwnOrphans(ctx)
	if err != nil || len(removed) != 1 || !strings.HasSuffix(removed[0], "000002.parquet") {
		t.Fatalf("removed %v (%v), want the unlisted upload only", removed, err)
	}
}

func TestIntegrationOrphansRemoved(t *testing.T) {
	cfg := testConfig(t)
	ctx := context.Background()
	dead := open(t, cfg, "dead-1")
	if err := dead.Claim(ctx, []string{"topic/0"}, 1); err != nil {
		t.Fatal(err)
	}
	// dead uploads a shard and dead letters, then crashes before appending.
	if err := dead.putIfAbsent(ctx, dead.key("policy=0/part-dead-1-000001.parquet"), bytes.NewReader([]byte("x")), 1, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := dead.PutDeadLetters(ctx, 1, []byte("{}\n")); err != nil {
		t.Fatal(err)
	}
	heir := open(t, cfg, "heir-1")
	// While dead still holds its claim, its uploads may yet be committed.
	if removed, err := heir.RemoveOrphans(ctx); err != nil || len(removed) != 0 {
		t.Fatalf("removed %v (%v) while the writer holds a claim", removed, err)
	}
	// Claiming the stream fences dead and removes its orphans.
	if err := heir.Claim(ctx, []string{"topic/0"}, 2); err != nil {
		t.Fatal(err)
	}
	for obj := range heir.cli.ListObjects(ctx, heir.cfg.Bucket, minio.ListObjectsOptions{Prefix: heir.key(""), Recursive: true}) {
		if obj.Err != nil {
			t.Fatal(obj.Err)
		}
		if strings.Contains(obj.Key, "dead-1-") {
			t.Errorf("orphan %s kept", obj.Key)
		}
	}
}

// TestIntegrationLargeObjectCreateOnly checks the create-only guarantee on
// shards large enough that minio-go would upload them in parts (from 16
// MiB): with multipart on, all three racers "won" here, so putIfAbsent
// uploads in one PUT.
func TestIntegrationLargeObjectCreateOnly(t *testing.T) {
	cfg := testConfig(t)
	s := open(t, cfg, "w")
	body := bytes.Repeat([]byte("0123456789abcdef"), (20<<20)/16) // 20 MiB
	if wins := raceCreateOnly(t, s, "big/obj", 3, func(int) []byte { return body }); wins != 1 {
		t.Fatalf("%d create-only uploads of 20 MiB won, want exactly 1", wins)
	}
	info, err := s.cli.StatObject(context.Background(), cfg.Bucket, s.key("big/obj"), minio.StatObjectOptions{})
	if err != nil || info.Size != int64(len(body)) {
		t.Fatalf("stat: %v size %d", err, info.Size)
	}
}

// The suite runs twice: with snapshots every 4 entries (and segments of 3
// listed entries), every test also runs across compactions of the
// manifest and snapshots made of sealed segments.
func TestIntegrationConformance(t *testing.T) {
	for _, every := range []int{0, 4} {
		t.Run(fmt.Sprintf("snapshot-every-%d", every), func(t *testing.T) { conformance(t, every) })
	}
}

func conformance(t *testing.T, every int) {
	base := testConfig(t)
	base.SnapshotEvery = every
	if every > 0 {
		base.SegmentSize = 3
	}
	cfgOf := func(root string) Config { c := base; c.Prefix = root; return c }
	storetest.Run(t, storetest.Backend{
		NewRoot: func(t *testing.T) string {
			var b [4]byte
			rand.Read(b[:])
			return strings.ReplaceAll(t.Name(), "/", "-") + "-" + hex.EncodeToString(b[:])
		},
		Open: func(t *testing.T, root, writer string) (store.Store, error) {
			return Open(context.Background(), cfgOf(root), writer)
		},
		OpenReader: func(t *testing.T, root string) (store.Reader, error) {
			return OpenReader(context.Background(), cfgOf(root), "reader")
		},
		Put: func(t *testing.T, root, rel string, data []byte) {
			s := open(t, cfgOf(root), "put")
			if _, err := s.cli.PutObject(context.Background(), s.cfg.Bucket, s.key(rel), bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{}); err != nil {
				t.Fatal(err)
			}
		},
		Exists: func(t *testing.T, root, rel string) bool {
			s := open(t, cfgOf(root), "stat")
			_, err := s.cli.StatObject(context.Background(), s.cfg.Bucket, s.key(rel), minio.StatObjectOptions{})
			if err != nil && minio.ToErrorResponse(err).Code != "NoSuchKey" {
				t.Fatal(err)
			}
			return err == nil
		},
		Crash: func(t *testing.T, st store.Store) {}, // it holds nothing: it just stops
	})
}

// With snapshots every 8 entries and segments of 5 listed entries, two
// writers and a writer that slept through compactions append; readers
// opening from the newest snapshot see every shard once, the manifest
// folder stays small but for the sealed segments, and the newest
// snapshot holds fewer entries than a segment.
func TestIntegrationManifestCompaction(t *testing.T) {
	cfg := testConfig(t)
	cfg.SnapshotEvery = 8
	cfg.SegmentSize = 5
	ctx := context.Background()
	sleeper := open(t, cfg, "sleeper")
	if err := sleeper.Claim(ctx, []string{"s/sleeper"}, 0); err != nil {
		t.Fatal(err)
	}
	a, b := open(t, cfg, "wa"), open(t, cfg, "wb")
	var want []string
	for i := range 60 {
		w := a
		if i%2 == 1 {
			w = b
		}
		rel := fmt.Sprintf("policy=0/part-%s-%06d.parquet", w.writer, i)
		p, err := w.Create(ctx, rel)
		if err != nil {
			t.Fatal(err)
		}
		p.Write([]byte("x"))
		if err := p.Commit(ctx, schemas.ShardEntry{Rows: 1, Settled: schemas.Settled{"s/" + w.writer: {{int64(i), int64(i)}}}}); err != nil {
			t.Fatal(err)
		}
		want = append(want, rel)
		if i%10 == 0 { // a checkpoint without a shard, folded by snapshots
			if err := w.Append(ctx, schemas.ShardEntry{Settled: schemas.Settled{"s/" + w.writer: {{int64(1000 + i), int64(1000 + i)}}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The sleeper's next entry was compacted away: it lands at the end.
	p, err := sleeper.Create(ctx, "policy=0/part-sleeper-000001.parquet")
	if err != nil {
		t.Fatal(err)
	}
	p.Write([]byte("x"))
	if err := p.Commit(ctx, schemas.ShardEntry{Rows: 1, Settled: schemas.Settled{"s/sleeper": {{1, 1}}}}); err != nil {
		t.Fatal(err)
	}
	want = append(want, "policy=0/part-sleeper-000001.parquet")
	r, err := OpenReader(ctx, cfg, "reader")
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.Committed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, e := range got {
		seen[e.Path]++
	}
	for _, w := range want {
		if seen[w] != 1 {
			t.Errorf("%s listed %d times", w, seen[w])
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d shards listed, want %d", len(got), len(want))
	}
	if s := r.Settled(); s["s/wa"].Len() != 36 || s["s/wb"].Len() != 30 || s["s/sleeper"].Len() != 1 {
		t.Fatalf("settled %v", s)
	}
	names, err := (&Objects{s: r, dir: store.ManifestDir}).List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var rest []string
	segs := 0
	for _, n := range names {
		if strings.HasPrefix(n, "seg-") {
			segs++
		} else {
			rest = append(rest, n)
		}
	}
	if len(rest) > 2+2*8+1 {
		t.Fatalf("%d objects in the manifest folder after compaction: %v", len(rest), rest)
	}
	if segs < len(want)/5-2 {
		t.Fatalf("%d sealed segments for %d shards in segments of 5", segs, len(want))
	}
	data, _, _, err := store.NewJournal(&Objects{s: r, dir: store.ManifestDir}).Latest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var head struct {
		Entries []json.RawMessage `json:"entries"`
	}
	if err := json.Unmarshal(data, &head); err != nil || len(head.Entries) >= 5+8 {
		t.Fatalf("the newest snapshot holds %d entries (%v): its sealed part is not in segments", len(head.Entries), err)
	}
}

// TestIntegrationDeleteAll: a store's objects go, manifest included, and a
// neighbouring prefix that shares the first letters stays.
func TestIntegrationDeleteAll(t *testing.T) {
	cfg := testConfig(t)
	ctx := context.Background()
	neighbour := cfg
	neighbour.Prefix = cfg.Prefix + "-neighbour"
	for _, c := range []Config{cfg, neighbour} {
		w := open(t, c, "w-1")
		for i := range 3 {
			p, err := w.Create(ctx, fmt.Sprintf("policy=0/part-w-1-%06d.parquet", i))
			if err != nil {
				t.Fatal(err)
			}
			p.Write([]byte("shard"))
			if err := p.Commit(ctx, schemas.ShardEntry{Rows: 1}); err != nil {
				t.Fatal(err)
			}
		}
	}
	w := open(t, cfg, "w-2")
	n, err := w.DeleteAll(ctx)
	if err != nil || n < 6 { // 3 shards and 3 manifest entries at least
		t.Fatalf("deleted %d objects (%v), want the 3 shards and the manifest", n, err)
	}
	count := func(c Config) int {
		k := 0
		for obj := range w.cli.ListObjects(ctx, c.Bucket, minio.ListObjectsOptions{Prefix: c.Prefix + "/", Recursive: true}) {
			if obj.Err != nil {
				t.Fatal(obj.Err)
			}
			k++
		}
		return k
	}
	if k := count(cfg); k != 0 {
		t.Errorf("%d objects left under the prefix", k)
	}
	if k := count(neighbour); k < 6 {
		t.Errorf("the neighbouring prefix lost objects: %d left", k)
	}
	if entries, err := open(t, cfg, "w-3").Entries(ctx); err != nil || len(entries) != 0 {
		t.Errorf("the manifest still lists %d shards (%v)", len(entries), err)
	}
}

// TestIntegrationLazyWriterKeepsSealedShards: a writer opens without
// reading the manifest's sealed segments, takes over a dead writer's
// stream and removes that writer's unlisted shard, but none of its
// committed shards, whose entries are only in segments it had not read.
func TestIntegrationLazyWriterKeepsSealedShards(t *testing.T) {
	cfg := testConfig(t)
	cfg.SnapshotEvery, cfg.SegmentSize = 4, 3
	ctx := context.Background()
	dead := open(t, cfg, "wdead")
	if err := dead.Claim(ctx, []string{"s"}, 1); err != nil {
		t.Fatal(err)
	}
	var committed []string
	for i := range 20 {
		rel := fmt.Sprintf("policy=0/part-wdead-%06d.parquet", i)
		p, err := dead.Create(ctx, rel)
		if err != nil {
			t.Fatal(err)
		}
		p.Write([]byte("x"))
		if err := p.Commit(ctx, schemas.ShardEntry{Rows: 1, Settled: schemas.Settled{"s": {{int64(i), int64(i)}}}}); err != nil {
			t.Fatal(err)
		}
		committed = append(committed, rel)
	}
	orphan := "policy=0/part-wdead-000099.parquet"
	if _, err := dead.cli.PutObject(ctx, cfg.Bucket, dead.key(orphan), bytes.NewReader([]byte("never listed")), 12, minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	next := open(t, cfg, "wnext")
	if next.log.Loaded() {
		t.Fatal("the writer read the sealed segments at open")
	}
	if err := next.Claim(ctx, []string{"s"}, 2); err != nil {
		t.Fatal(err)
	}
	exists := func(rel string) bool {
		_, err := next.cli.StatObject(ctx, cfg.Bucket, next.key(rel), minio.StatObjectOptions{})
		return err == nil
	}
	if exists(orphan) {
		t.Error("the dead writer's unlisted shard survived the takeover")
	}
	for _, rel := range committed {
		if !exists(rel) {
			t.Fatalf("committed shard %s was removed", rel)
		}
	}
	if got, err := next.Committed(ctx); err != nil || len(got) != len(committed) {
		t.Fatalf("%d shards listed (%v), want %d", len(got), err, len(committed))
	}
}

// TestIntegrationGetFile: GetFile streams an object to a file (the bytes,
// nothing left beside it) and says a missing one is missing.
func TestIntegrationGetFile(t *testing.T) {
	cfg := testConfig(t)
	s := open(t, cfg, "getfile")
	ctx := context.Background()
	objs, err := s.Objects("_compact")
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	if err := objs.Create(ctx, "big.parquet", data); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	n, err := s.GetFile(ctx, "_compact/big.parquet", filepath.Join(dir, "big.parquet"))
	if err != nil || n != int64(len(data)) {
		t.Fatalf("GetFile: %d bytes, %v", n, err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "big.parquet"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("downloaded %d bytes (%v), not the object's %d", len(got), err, len(data))
	}
	if _, err := s.GetFile(ctx, "_compact/none.parquet", filepath.Join(dir, "none.parquet")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a missing object: %v, want fs.ErrNotExist", err)
	}
	if _, err := s.GetFile(ctx, "../x", filepath.Join(dir, "x")); err == nil {
		t.Fatal("a path leaving the root was downloaded")
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 1 {
		t.Fatalf("files left: %v, want only big.parquet", left)
	}
}
