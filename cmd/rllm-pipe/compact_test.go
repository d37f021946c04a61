package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/rllm-pipe/rllm-pipe/connectors/compact"
)

// compactViews is the query whose answer compaction must not change:
// every view over the steps, row by row (hashed), and the shards table but
// for the file a shard's rows were read from. Float aggregates summed in
// another order (DuckDB's threads split the work by file) may differ in
// their last bits: they are rounded.
const compactViews = `SELECT 'steps' AS v, count(*) AS n, bit_xor(hash(v)) AS h FROM (SELECT * FROM steps) v
UNION ALL SELECT 'stored_steps', count(*), bit_xor(hash(v)) FROM (SELECT * FROM stored_steps) v
UNION ALL SELECT 'trajectories', count(*), bit_xor(hash(v)) FROM (SELECT * FROM trajectories) v
UNION ALL SELECT 'groups', count(*), bit_xor(hash(v)) FROM (SELECT * REPLACE (round(reward_mean, 9) AS reward_mean, round(reward_std, 9) AS reward_std) FROM groups) v
UNION ALL SELECT 'shards', count(*), bit_xor(hash(v)) FROM (SELECT * EXCLUDE (file) FROM shards) v
UNION ALL SELECT 'prompt tokens', count(*), sum(len(prompt_ids)) FROM steps
UNION ALL SELECT 'dead_letters', count(*), bit_xor(hash(v)) FROM (SELECT * FROM dead_letters) v
UNION ALL SELECT 'dead_letter_commits', count(*), bit_xor(hash(v)) FROM (SELECT * FROM dead_letter_commits) v
ORDER BY v`

// compactDigest answers compactViews over from.
func compactDigest(t *testing.T, bin, work, from string, extra ...string) string {
	t.Helper()
	res := e2eRun(t, bin, work, append([]string{"sql", "--from", from, "--format", "csv", compactViews}, extra...)...)
	if res.code != 0 {
		t.Fatalf("sql: exit %d\n%s", res.code, e2eClip(res.stderr, 4000))
	}
	return res.stdout
}

// compactFiles returns how many files the views read, and how many of
// them are compacted files.
func compactFiles(t *testing.T, bin, work, from string, extra ...string) (files, merged int) {
	t.Helper()
	q := `SELECT count(DISTINCT file) AS files, count(DISTINCT file) FILTER (WHERE regexp_matches(file, '/(_compact|compacted)/[^/]+$')) AS merged FROM shards`
	res := e2eRun(t, bin, work, append([]string{"sql", "--from", from, "--format", "csv", q}, extra...)...)
	if res.code != 0 {
		t.Fatalf("sql %q: exit %d\n%s", q, res.code, e2eClip(res.stderr, 4000))
	}
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	if _, err := fmt.Sscanf(lines[len(lines)-1], "%d,%d", &files, &merged); err != nil {
		t.Fatalf("files: %q: %v", res.stdout, err)
	}
	return files, merged
}

// compactInputs generates multi-turn agents (prefix deltas stored) and
// splits them into one file per task, so that each ingest of one commits
// one small shard; every third file has two bad lines (dead letters).
func compactInputs(t *testing.T, bin, work string, groups int, seed string) []string {
	t.Helper()
	all := filepath.Join(work, "all-"+seed+".jsonl")
	if r := e2eRun(t, bin, work, "gen", "--turns", "2..5", "--groups", fmt.Sprint(groups), "--group-size", "2", "--seed", seed, "--to", all); r.code != 0 {
		t.Fatalf("gen: exit %d\n%s", r.code, r.stderr)
	}
	data, err := os.ReadFile(all)
	if err != nil {
		t.Fatal(err)
	}
	byTask := map[string][][]byte{}
	for _, l := range e2eSplitLines(data) {
		var rec struct {
			Task string `json:"task_id"`
		}
		mustUnmarshal(t, l, &rec)
		byTask[rec.Task] = append(byTask[rec.Task], l)
	}
	tasks := make([]string, 0, len(byTask))
	for task := range byTask {
		tasks = append(tasks, task)
	}
	sort.Strings(tasks)
	var files []string
	for i, task := range tasks {
		f := filepath.Join(work, fmt.Sprintf("part-%s-%03d.jsonl", seed, i))
		lines := byTask[task]
		if i%3 == 1 {
			lines = append(lines, []byte(`{"type":"step","step_id":"bad-`+seed+fmt.Sprint(i)+`"}`), []byte("not json "+seed+fmt.Sprint(i)))
		}
		if err := os.WriteFile(f, e2eJoinLines(lines), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

// testCompact checks compaction over one root (to, with the flags extra):
// the views answer the same before and after every step, over fewer files;
// a later compaction continues where the last stopped; a record that does
// not match the manifest, or a missing compacted file, is passed over
// with a warning (the shards are read instead); two compactions at once
// leave the views whole.
func testCompact(t *testing.T, bin, work, to string, objs func() compactObjects, extra ...string) {
	ingest := func(files []string) {
		for _, f := range files {
			args := append([]string{"ingest", "--from", e2eFileURL(f), "--to", to, "--group-size", "2", "--quiet"}, extra...)
			if r := e2eRun(t, bin, work, args...); r.code != 0 {
				t.Fatalf("ingest %s: exit %d\n%s", f, r.code, e2eClip(r.stderr, 4000))
			}
		}
	}
	compactRun := func(args ...string) e2eRunResult {
		t.Helper()
		r := e2eRun(t, bin, work, append(append([]string{"compact", "--from", to, "--min-shards", "2", "--max-shards", "4"}, args...), extra...)...)
		if r.code != 0 {
			t.Fatalf("compact: exit %d\n%s", r.code, e2eClip(r.stderr, 4000))
		}
		return r
	}
	ingest(compactInputs(t, bin, work, 10, "1"))
	before := compactDigest(t, bin, work, to, extra...)
	if files, merged := compactFiles(t, bin, work, to, extra...); files != 10 || merged != 0 {
		t.Fatalf("before compaction the views read %d files (%d compacted), want the 10 shards", files, merged)
	}

	compactRun()
	if got := compactDigest(t, bin, work, to, extra...); got != before {
		t.Fatalf("the views changed with compaction:\nbefore\n%s\nafter\n%s", before, got)
	}
	// Read from the snapshot: no warning (a snapshot passed over says so).
	if res := e2eRun(t, bin, work, append([]string{"sql", "--from", to, "SELECT 1"}, extra...)...); res.code != 0 || strings.Contains(res.stderr, "warning") {
		t.Fatalf("sql after compaction: exit %d, stderr %q (want no warning)", res.code, res.stderr)
	}
	// 10 shards, 4 at most a file: 4 + 4 merged, 2 waiting for more.
	if files, merged := compactFiles(t, bin, work, to, extra...); files != 2+2 || merged != 2 {
		t.Fatalf("after compaction the views read %d files (%d compacted), want 2 compacted and the 2 newest shards", files, merged)
	}
	if r := compactRun(); !strings.Contains(r.stderr, "nothing to merge") {
		t.Fatalf("a second compaction with nothing new: %s", r.stderr)
	}

	// More commits: the next compaction continues from the 9th shard.
	ingest(compactInputs(t, bin, work, 6, "2"))
	before = compactDigest(t, bin, work, to, extra...)
	compactRun()
	if got := compactDigest(t, bin, work, to, extra...); got != before {
		t.Fatalf("the views changed with the second compaction:\nbefore\n%s\nafter\n%s", before, got)
	}
	if files, merged := compactFiles(t, bin, work, to, extra...); files != 4 || merged != 4 {
		t.Fatalf("after the second compaction the views read %d files (%d compacted), want 4 compacted (16 shards)", files, merged)
	}
	// Commits after the snapshot are read from the manifest's tail.
	ingest(compactInputs(t, bin, work, 2, "4"))
	before = compactDigest(t, bin, work, to, extra...)

	o := objs()
	// A snapshot gone: the manifest is read whole, the views the same.
	snaps := o.list("snapshot-")
	if len(snaps) == 0 {
		t.Fatal("no compaction snapshot")
	}
	snapName := snaps[len(snaps)-1]
	snapData := o.get(snapName)
	o.remove(snapName)
	res := e2eRun(t, bin, work, append([]string{"sql", "--from", to, "--format", "csv", "SELECT count(*) FROM steps"}, extra...)...)
	if res.code != 0 || !strings.Contains(res.stderr, "not used (missing)") {
		t.Fatalf("a missing snapshot: exit %d, stderr %q (want a warning)", res.code, res.stderr)
	}
	if got := compactDigest(t, bin, work, to, extra...); got != before {
		t.Fatalf("read without the snapshot, the views differ:\n%s\nwant\n%s", got, before)
	}
	o.put(snapName, snapData)

	names := o.list("record-")
	if len(names) == 0 {
		t.Fatal("no compaction record")
	}
	newest := names[len(names)-1]
	saved := o.get(newest)
	// A record naming other shards than the manifest: its ranges are
	// passed over, with a warning.
	var rec compact.Record
	mustUnmarshal(t, saved, &rec)
	rec.Ranges[1].FirstPath = "policy=0/not-this-one.parquet"
	o.put(newest, mustJSON(t, rec))
	res = e2eRun(t, bin, work, append([]string{"sql", "--from", to, "--format", "csv", "SELECT count(*) FROM steps"}, extra...)...)
	if res.code != 0 || !strings.Contains(res.stderr, "does not match the manifest") {
		t.Fatalf("a record that does not match: exit %d, stderr %q (want a warning)", res.code, res.stderr)
	}
	if got := compactDigest(t, bin, work, to, extra...); got != before {
		t.Fatalf("with a record that does not match, the views changed:\n%s\nwant\n%s", got, before)
	}
	if files, merged := compactFiles(t, bin, work, to, extra...); files != 3+4+2 || merged != 3 {
		t.Fatalf("with one range passed over the views read %d files (%d compacted), want 3 compacted and 4+2 shards", files, merged)
	}
	o.put(newest, saved)
	// A compacted file gone: its shards are read from their own files.
	gone := rec.Ranges[0].File
	data := o.get(gone)
	o.remove(gone)
	res = e2eRun(t, bin, work, append([]string{"sql", "--from", to, "--format", "csv", "SELECT count(*) FROM steps"}, extra...)...)
	if res.code != 0 || !strings.Contains(res.stderr, gone+" is missing") {
		t.Fatalf("a missing compacted file: exit %d, stderr %q (want a warning naming it)", res.code, res.stderr)
	}
	if got := compactDigest(t, bin, work, to, extra...); got != before {
		t.Fatalf("with a compacted file missing, the views changed:\n%s\nwant\n%s", got, before)
	}
	o.put(gone, data)

	// Two compactions at once: one records its work (the other may lose
	// the race and say so); the views stay whole.
	ingest(compactInputs(t, bin, work, 4, "3"))
	before = compactDigest(t, bin, work, to, extra...)
	done := make(chan e2eRunResult, 2)
	for range 2 {
		go func() {
			done <- e2eRun(t, bin, work, append([]string{"compact", "--from", to, "--min-shards", "2", "--max-shards", "4"}, extra...)...)
		}()
	}
	for range 2 {
		r := <-done
		if r.code != 0 && !strings.Contains(r.stderr, "another compaction recorded its work first") {
			t.Fatalf("a concurrent compaction failed: exit %d\n%s", r.code, r.stderr)
		}
	}
	if got := compactDigest(t, bin, work, to, extra...); got != before {
		t.Fatalf("two compactions at once changed the views:\n%s\nwant\n%s", got, before)
	}
	// Files of a compaction that lost the race or died before its record:
	// removed by the next one once the newest record has looked past
	// them; one beyond may belong to a compaction under way: kept.
	o.put("dead-0-4.parquet", data)
	o.put("dead-1000-1004.parquet", data)
	if r := compactRun(); !strings.Contains(r.stderr, "1 leftover files removed") {
		t.Errorf("compaction after leftovers: %q, want one removed", r.stderr)
	}
	left := map[string]bool{}
	for _, n := range o.list("") {
		left[n] = true
	}
	if left["dead-0-4.parquet"] {
		t.Error("a leftover below the record's end was kept")
	}
	if !left["dead-1000-1004.parquet"] {
		t.Error("a file beyond the record's end was removed (want it kept)")
	}
	o.remove("dead-1000-1004.parquet")
	names = o.list("record-")
	mustUnmarshal(t, o.get(names[len(names)-1]), &rec)
	listed := map[string]bool{}
	for _, g := range rec.Ranges {
		listed[g.File] = true
	}
	for _, n := range o.list("") {
		if strings.HasSuffix(n, ".parquet") && !strings.HasPrefix(n, "snapshot-") && !listed[n] {
			t.Errorf("compacted file %s is in no record after a later compaction", n)
		}
	}
	if len(names) > 2 {
		t.Errorf("records kept: %d, want the newest two", len(names))
	}
	// Snapshots: the newest record's and the one before's.
	if snaps := o.list("snapshot-"); len(snaps) > 2 || rec.Snapshot == nil || !slices.Contains(snaps, rec.Snapshot.File) {
		t.Errorf("snapshots kept: %v, want the newest two records' (the newest: %+v)", snaps, rec.Snapshot)
	}
}

// compactObjects reads and changes the objects of a root's compact folder
// behind the store's back, as damage would.
type compactObjects struct {
	get    func(name string) []byte
	put    func(name string, data []byte)
	remove func(name string)
	list   func(prefix string) []string // sorted
}

func localCompactObjects(t *testing.T, root string) compactObjects {
	dir := filepath.Join(root, compact.Dir)
	return compactObjects{
		get: func(name string) []byte {
			data, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			return data
		},
		put: func(name string, data []byte) {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		},
		remove: func(name string) {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		},
		list: func(prefix string) []string {
			names, err := filepath.Glob(filepath.Join(dir, prefix+"*"))
			if err != nil {
				t.Fatal(err)
			}
			for i := range names {
				names[i] = filepath.Base(names[i])
			}
			sort.Strings(names)
			return names
		},
	}
}

func s3CompactObjects(t *testing.T, target s3Target) compactObjects {
	st := target.open(t, "compact-test")
	cli, bucket := st.Client()
	ctx := context.Background()
	key := func(name string) string { return st.Key(compact.Dir + "/" + name) }
	return compactObjects{
		get: func(name string) []byte {
			obj, err := cli.GetObject(ctx, bucket, key(name), minio.GetObjectOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer obj.Close()
			data, err := io.ReadAll(obj)
			if err != nil {
				t.Fatal(err)
			}
			return data
		},
		put: func(name string, data []byte) {
			if _, err := cli.PutObject(ctx, bucket, key(name), bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{}); err != nil {
				t.Fatal(err)
			}
		},
		remove: func(name string) {
			if err := cli.RemoveObject(ctx, bucket, key(name), minio.RemoveObjectOptions{}); err != nil {
				t.Fatal(err)
			}
		},
		list: func(prefix string) []string {
			var names []string
			for obj := range cli.ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: key(prefix)}) {
				if obj.Err != nil {
					t.Fatal(obj.Err)
				}
				names = append(names, strings.TrimPrefix(obj.Key, key("")))
			}
			sort.Strings(names)
			return names
		},
	}
}

// The compaction tests run in parallel with each other (each has its own
// root): they spend their time in child processes.

func TestCompactKeepsEveryView(t *testing.T) {
	t.Parallel()
	bin := e2eBinary(t)
	work := t.TempDir()
	out := filepath.Join(work, "out")
	testCompact(t, bin, work, e2eFileURL(out), func() compactObjects { return localCompactObjects(t, out) })
}

func TestIntegrationCompactS3(t *testing.T) {
	t.Parallel()
	target := newS3Target(t, "compact")
	bin := e2eBinary(t)
	testCompact(t, bin, t.TempDir(), target.url, func() compactObjects { return s3CompactObjects(t, target) }, target.flags()...)
}

// TestCompactEvery: with --every, compact merges what each interval
// brings until a signal stops it, which exits 0 between runs.
func TestCompactEvery(t *testing.T) {
	t.Parallel()
	bin := e2eBinary(t)
	work := t.TempDir()
	out := filepath.Join(work, "out")
	files := compactInputs(t, bin, work, 8, "1")
	ingest := func(files []string) {
		for _, f := range files {
			if r := e2eRun(t, bin, work, "ingest", "--from", e2eFileURL(f), "--to", out, "--group-size", "2", "--quiet"); r.code != 0 {
				t.Fatalf("ingest %s: exit %d\n%s", f, r.code, e2eClip(r.stderr, 4000))
			}
		}
	}
	ingest(files[:4])
	cmd := exec.Command(bin, "compact", "--from", out, "--min-shards", "2", "--max-shards", "2", "--every", "100ms")
	cmd.Env = e2eEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	merged := func() int {
		names, _ := filepath.Glob(filepath.Join(out, compact.Dir, "compact-*.parquet"))
		return len(names)
	}
	waitFor := func(n int) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for merged() < n {
			if time.Now().After(deadline) {
				t.Fatalf("%d merged files after a minute, want %d\n%s", merged(), n, stderr.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFor(2)
	ingest(files[4:])
	waitFor(4)
	if err := terminate(t, cmd, waitChan(cmd), &stderr); err != nil {
		t.Fatalf("compact --every after SIGTERM: %v (want exit 0)\n%s", err, stderr.String())
	}
	if files, m := compactFiles(t, bin, work, out); files != 4 || m != 4 {
		t.Fatalf("the views read %d files (%d compacted), want the 4 compacted", files, m)
	}
	got := compactDigest(t, bin, work, out)
	aside := filepath.Join(work, "aside")
	if err := os.Rename(filepath.Join(out, compact.Dir), aside); err != nil {
		t.Fatal(err)
	}
	if want := compactDigest(t, bin, work, out); got != want {
		t.Fatalf("the views over the compacted files:\n%s\nover the shards:\n%s", got, want)
	}
}
