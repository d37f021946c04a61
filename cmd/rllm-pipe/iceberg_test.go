package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/iceberg-go/table"
	"github.com/rllm-pipe/rllm-pipe/connectors"

	icebergsync "github.com/rllm-pipe/rllm-pipe/connectors/iceberg"
	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/s3"
)

// TestIcebergSyncKilledAndFollowing: `iceberg sync` killed with SIGKILL
// at random moments while it adds a root one shard per commit, then a
// --follow syncer beside an ingest that keeps committing: in the end the
// table lists every committed shard once, and the rows sql counts.
func TestIcebergSyncKilledAndFollowing(t *testing.T) {
	bin := e2eIcebergBinary(t)
	work := t.TempDir()
	root := filepath.Join(work, "out")
	ingestRun := func(seed, versions int) {
		in := filepath.Join(work, fmt.Sprintf("t%d.jsonl", seed))
		if r := e2eRun(t, bin, work, "gen", "--groups", "40", "--group-size", "2", "--turns", "1..3", "--policy-versions", fmt.Sprint(versions),
			"--seed", fmt.Sprint(seed), "--to", in); r.code != 0 {
			t.Fatalf("gen: %s", r.stderr)
		}
		if r := e2eRun(t, bin, work, "ingest", "--from", in, "--to", root, "--group-size", "2", "--quiet"); r.code != 0 {
			t.Fatalf("ingest: %s", r.stderr)
		}
	}
	for seed := range 6 {
		ingestRun(seed, 6) // a shard per version and run
	}
	catalog := filepath.Join(work, "lake", "catalog.db")
	sync := []string{"iceberg", "sync", "--from", root, "--catalog", catalog, "--max-files-per-commit", "1", "--quiet"}
	kills := 0
	var positions []int
	for i := range 6 {
		cmd := exec.Command(bin, sync...)
		cmd.Env = e2eEnv()
		var se bytes.Buffer
		cmd.Stderr = &se
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(500+200*i) * time.Millisecond)
		_ = cmd.Process.Kill()
		if err := cmd.Wait(); err != nil {
			if ee, ok := err.(*exec.ExitError); !ok || !strings.Contains(ee.Error(), "killed") {
				t.Fatalf("sync: %v\n%s", err, se.String())
			}
			kills++
		}
		checkIcebergPrefix(t, root, catalog)
		positions = append(positions, icebergPosition(t, catalog))
	}
	// More commits while a follower syncs.
	follow := exec.Command(bin, "iceberg", "sync", "--from", root, "--catalog", catalog, "--follow", "--poll", "100ms", "--json")
	follow.Env = e2eEnv()
	var fo, fe bytes.Buffer
	follow.Stdout, follow.Stderr = &fo, &fe
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	for seed := 10; seed < 13; seed++ {
		ingestRun(seed, 3)
	}
	n := len(committedPaths(t, root))
	deadline := time.Now().Add(60 * time.Second)
	for {
		pos := icebergPosition(t, catalog)
		if pos == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the follower holds %d of %d shards after 60 s: %s", pos, n, fe.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = follow.Process.Signal(os.Interrupt)
	if err := follow.Wait(); err != nil {
		t.Fatalf("follower: %v\n%s", err, fe.String())
	}
	checkIcebergPrefix(t, root, catalog)
	if !strings.Contains(fo.String(), `"shards":`) {
		t.Errorf("--json printed no result: %q", fo.String())
	}
	t.Logf("%d of 6 syncs killed, holding %v shards after each; %d shards in the end", kills, positions, n)
	if kills == 0 {
		t.Error("no sync was killed: the test kills nothing")
	}
	if slices.Max(positions) == 0 {
		t.Error("every kill came before the first commit: the test kills no sync mid-way")
	}
	if r := e2eRun(t, bin, work, "iceberg", "sync", "--from", root, "--catalog", catalog, "--max-files-per-commit", "0"); r.code != exitUsage {
		t.Errorf("--max-files-per-commit 0: exit %d, want %d", r.code, exitUsage)
	}
}

func committedPaths(t *testing.T, root string) []string {
	t.Helper()
	r, err := local.OpenReader(root)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	es, err := r.Committed(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Path)
	}
	return out
}

// loadIcebergTable loads the table rllm.name of the SQLite catalog at
// catalog (nil when absent).
func loadIcebergTable(t *testing.T, catalog, name string) *table.Table {
	t.Helper()
	cat, err := icebergsync.OpenCatalog(context.Background(), catalog, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cat.Close()
	tbl, err := cat.LoadTable(context.Background(), []string{"rllm", name})
	if err != nil {
		return nil
	}
	return tbl
}

// icebergPosition is how many shards the steps table holds (0 before it
// exists).
func icebergPosition(t *testing.T, catalog string) int {
	t.Helper()
	tbl := loadIcebergTable(t, catalog, icebergsync.StepsTable)
	if tbl == nil {
		return 0
	}
	pos, err := icebergsync.Position(tbl)
	if err != nil {
		t.Fatal(err)
	}
	return pos.Shards
}

// checkIcebergPrefix fails t unless the table lists exactly the first
// shards of the manifest its position says, each once.
func checkIcebergPrefix(t *testing.T, root, catalog string) {
	t.Helper()
	tbl := loadIcebergTable(t, catalog, icebergsync.StepsTable)
	if tbl == nil {
		return // killed before it made the table
	}
	pos, err := icebergsync.Position(tbl)
	if err != nil {
		t.Fatal(err)
	}
	tasks, err := tbl.Scan().PlanFiles(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, task := range tasks {
		got[strings.TrimPrefix(task.File.FilePath(), "file://"+root+"/")]++
	}
	want := committedPaths(t, root)[:pos.Shards]
	for _, p := range want {
		if got[p] != 1 {
			t.Errorf("shard %s listed %d times", p, got[p])
		}
	}
	if len(got) != len(want) {
		t.Errorf("the table lists %d files, its position says %d shards", len(got), len(want))
	}
}

// TestIngestKeepsAnIcebergTable: ingest --iceberg-catalog leaves the
// table holding every shard it committed, and says so in its stats.
func TestIngestKeepsAnIcebergTable(t *testing.T) {
	bin := e2eIcebergBinary(t)
	work := t.TempDir()
	in := filepath.Join(work, "t.jsonl")
	if r := e2eRun(t, bin, work, "gen", "--groups", "30", "--group-size", "2", "--policy-versions", "3", "--to", in); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	root, catalog, stats := filepath.Join(work, "out"), filepath.Join(work, "c.db"), filepath.Join(work, "s.json")
	r := e2eRun(t, bin, work, "ingest", "--from", in, "--to", root, "--group-size", "2", "--flush-interval", "50ms",
		"--iceberg-catalog", catalog, "--iceberg-every", "20ms", "--stats-json", stats)
	if r.code != 0 {
		t.Fatalf("ingest: %s", r.stderr)
	}
	n := len(committedPaths(t, root))
	if pos := icebergPosition(t, catalog); pos != n || n == 0 {
		t.Fatalf("the table holds %d shards, ingest committed %d", pos, n)
	}
	checkIcebergPrefix(t, root, catalog)
	data, err := os.ReadFile(stats)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Iceberg struct {
			Shards, Position int
		}
	}
	if err := json.Unmarshal(data, &st); err != nil || st.Iceberg.Shards != n || st.Iceberg.Position != n {
		t.Errorf("stats iceberg %+v (%v), want %d shards added and held", st.Iceberg, err, n)
	}
	if !strings.Contains(r.stderr, "iceberg:") {
		t.Errorf("the summary does not mention the table:\n%s", r.stderr)
	}
	// A catalog URI of no kind known is the command line's error; a
	// catalog that does not answer leaves the run going without the table.
	if r := e2eRun(t, bin, work, "ingest", "--from", in, "--to", filepath.Join(work, "o2"), "--group-size", "2",
		"--iceberg-catalog", "ftp://example/c"); r.code != exitUsage || !strings.Contains(r.stderr, "catalog") {
		t.Errorf("--iceberg-catalog ftp://: exit %d, want %d naming the catalog\n%s", r.code, exitUsage, r.stderr)
	}
	r = e2eRun(t, bin, work, "ingest", "--from", in, "--to", filepath.Join(work, "o3"), "--group-size", "2",
		"--iceberg-catalog", "http://127.0.0.1:1", "--stats-json", stats)
	if r.code != 0 {
		t.Fatalf("ingest with the catalog down: exit %d\n%s", r.code, r.stderr)
	}
	var down struct {
		IcebergError string `json:"iceberg_error"`
	}
	if data, err := os.ReadFile(stats); err != nil || json.Unmarshal(data, &down) != nil || down.IcebergError == "" || len(committedPaths(t, filepath.Join(work, "o3"))) == 0 {
		t.Errorf("with the catalog down: stats %s (%v), want the shards committed and iceberg_error", data, err)
	}
}

// TestIcebergFollowerDiesWithIngest: an ingest killed with SIGKILL takes
// its iceberg follower with it (no orphan syncing on).
func TestIcebergFollowerDiesWithIngest(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the follower dies with its parent on Linux (Pdeathsig)")
	}
	bin := e2eIcebergBinary(t)
	work := t.TempDir()
	catalog := filepath.Join(work, "c.db")
	cmd := exec.Command(bin, "ingest", "--from", "-", "--to", filepath.Join(work, "out"), "--group-size", "2",
		"--iceberg-catalog", catalog, "--iceberg-every", "1h", "--quiet")
	cmd.Env, cmd.Dir = e2eEnv(), work
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var child int
	for deadline := time.Now().Add(30 * time.Second); child == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatal("no rllm-pipe-iceberg follower started")
		}
		child = childNamed(t, cmd.Process.Pid, icebergExe)
	}
	// Its first sync done (the table made, its result written), it
	// waits an hour for the next: nothing but its parent's death ends it.
	for deadline := time.Now().Add(60 * time.Second); loadIcebergTable(t, catalog, icebergsync.StepsTable) == nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatal("the follower made no table in 60 s")
		}
	}
	time.Sleep(500 * time.Millisecond)
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child))
		if err != nil || strings.Contains(string(data), ") Z ") {
			return // gone (or a zombie waiting for init)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the follower (pid %d) outlived its killed ingest by 10 s", child)
		}
	}
}

// childNamed returns the pid of a child of parent whose command is name
// (0: none).
func childNamed(t *testing.T, parent int, name string) int {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(data)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open {
			continue
		}
		f := strings.Fields(s[closing+1:])
		comm := s[open+1 : closing]
		if len(f) > 1 && f[1] == fmt.Sprint(parent) && strings.HasPrefix(name, comm) {
			var pid int
			fmt.Sscan(s[:open], &pid)
			return pid
		}
	}
	return 0
}

// TestMainBinaryLeavesIcebergOut: rllm-pipe does not link iceberg-go
// (rllm-pipe-iceberg does): its start-up would pay the library's package
// initialisation, tens of megabytes, on every command.
func TestMainBinaryLeavesIcebergOut(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "github.com/apache/iceberg-go") || strings.HasSuffix(p, "/connectors/iceberg") {
			t.Errorf("rllm-pipe imports %s: Iceberg belongs to %s", p, icebergExe)
		}
	}
}

// TestIntegrationIcebergOnS3: a root on MinIO synced into a table whose
// warehouse is on MinIO too (the root's _iceberg prefix): twice, adding
// nothing the second time, and the table read back through the catalog
// (its file IO on S3) holds the rows sql counts.
func TestIntegrationIcebergOnS3(t *testing.T) {
	bin := e2eIcebergBinary(t)
	tg := newS3Target(t, "iceberg")
	work := t.TempDir()
	in := filepath.Join(work, "t.jsonl")
	if r := e2eRun(t, bin, work, "gen", "--groups", "40", "--group-size", "2", "--turns", "1..3", "--policy-versions", "3", "--to", in); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	if r := e2eRun(t, bin, work, "ingest", "--from", in, "--to", tg.url, "--s3-endpoint", tg.endpoint, "--group-size", "2", "--quiet"); r.code != 0 {
		t.Fatalf("ingest: %s", r.stderr)
	}
	catalog := filepath.Join(work, "c.db")
	sync := []string{"iceberg", "sync", "--from", tg.url, "--s3-endpoint", tg.endpoint, "--catalog", catalog, "--json", "--quiet"}
	var first, again struct{ Shards, Position int }
	r := e2eRun(t, bin, work, sync...)
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &first) != nil {
		t.Fatalf("sync: %s%s", r.stdout, r.stderr)
	}
	r = e2eRun(t, bin, work, sync...)
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &again) != nil || again.Shards != 0 || again.Position != first.Position || first.Shards == 0 {
		t.Fatalf("syncs: %+v then %+v (%s)", first, again, r.stderr)
	}
	q := e2eRun(t, bin, work, "sql", "--from", tg.url, "--s3-endpoint", tg.endpoint, "--format", "csv", "SELECT count(*) FROM steps")
	if q.code != 0 {
		t.Fatalf("sql: %s", q.stderr)
	}
	want := strings.TrimSpace(strings.Split(q.stdout, "\n")[1])
	cfg, err := s3.ParseURL(tg.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Endpoint = tg.endpoint
	loc, err := icebergsync.LocationsOf(connectors.Root{S3: &cfg}, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	catProps := map[string]string{"warehouse": loc.Warehouse}
	for k, v := range loc.Props {
		catProps[k] = v
	}
	cat, err := icebergsync.OpenCatalog(ctx, catalog, "", catProps)
	if err != nil {
		t.Fatal(err)
	}
	defer cat.Close()
	tbl, err := cat.LoadTable(ctx, []string{"rllm", icebergsync.StepsTable})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tbl.Location(), "s3://") || !strings.HasPrefix(tbl.MetadataLocation(), tbl.Location()) {
		t.Errorf("table at %s, metadata %s: want the warehouse on S3", tbl.Location(), tbl.MetadataLocation())
	}
	arr, err := tbl.Scan().ToArrowTable(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer arr.Release()
	if got := fmt.Sprint(arr.NumRows()); got != want {
		t.Errorf("the table reads %s rows from S3, sql counts %s", got, want)
	}
}

// TestIcebergDeadLetters: the dead letters of two ingest runs land in the
// dead_letters table once each, as sql's dead_letters view has them;
// another sync adds none.
func TestIcebergDeadLetters(t *testing.T) {
	bin := e2eIcebergBinary(t)
	work := t.TempDir()
	root, catalog := filepath.Join(work, "out"), filepath.Join(work, "c.db")
	bad, err := filepath.Abs(filepath.Join("testdata", "bad.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	awkward, err := filepath.Abs(filepath.Join("testdata", "awkward.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	// A run whose commits mark its dead-letter file again and again:
	// broken lines among generated groups, committed every millisecond.
	gen := filepath.Join(work, "g.jsonl")
	if r := e2eRun(t, bin, work, "gen", "--groups", "200", "--group-size", "2", "--to", gen); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	data, err := os.ReadFile(gen)
	if err != nil {
		t.Fatal(err)
	}
	var mixed []string
	for i, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		mixed = append(mixed, l)
		if i%50 == 0 {
			mixed = append(mixed, fmt.Sprintf(`{"type":"step","broken":%d`, i))
		}
	}
	mix := filepath.Join(work, "mix.jsonl")
	if err := os.WriteFile(mix, []byte(strings.Join(mixed, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var added int64
	// The last run's dead letters go to a file outside the root, removed
	// before the sync: the sync leaves them out (as sql does) and says so,
	// instead of failing every sync after.
	outside := filepath.Join(work, "elsewhere", "dl.jsonl")
	broken := filepath.Join(work, "broken.jsonl")
	if err := os.WriteFile(broken, []byte("{\"type\":\"step\",\"broken\":1\nnot json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, in := range []string{bad, awkward, mix, broken} {
		args := []string{"ingest", "--from", in, "--to", root, "--group-size", "2", "--flush-interval", "1ms", "--quiet"}
		if i == 3 {
			args = append(args, "--dlq", outside)
		}
		if r := e2eRun(t, bin, work, args...); r.code != 0 {
			t.Fatalf("ingest: %s", r.stderr)
		}
		if i == 3 {
			if err := os.Remove(outside); err != nil {
				t.Fatal(err)
			}
		}
		r := e2eRun(t, bin, work, "iceberg", "sync", "--from", root, "--catalog", catalog, "--json", "--quiet")
		var res struct {
			DeadLetters int64 `json:"dead_letters"`
			Missing     int64 `json:"dead_letter_bytes_missing"`
		}
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &res) != nil {
			t.Fatalf("sync: %s%s", r.stdout, r.stderr)
		}
		if (res.Missing > 0) != (i == 3) {
			t.Errorf("run %d: %d dead-letter bytes missing", i, res.Missing)
		}
		added += res.DeadLetters
	}
	r := e2eRun(t, bin, work, "iceberg", "sync", "--from", root, "--catalog", catalog, "--json", "--quiet")
	if !strings.Contains(r.stdout, `"dead_letters":0`) {
		t.Errorf("a third sync: %s", r.stdout)
	}
	q := e2eRun(t, bin, work, "sql", "--from", root, "--format", "jsonl", "SELECT reason, source_file AS file, source_line AS line, record FROM dead_letters")
	if q.code != 0 {
		t.Fatalf("sql: %s", q.stderr)
	}
	var want []string
	for _, l := range strings.Split(strings.TrimSpace(q.stdout), "\n") {
		var d struct {
			Reason, File, Record string
			Line                 int64
		}
		if err := json.Unmarshal([]byte(l), &d); err != nil {
			t.Fatal(err)
		}
		want = append(want, fmt.Sprintf("%s|%s|%d|%s", d.Reason, d.File, d.Line, d.Record))
	}
	tbl := loadIcebergTable(t, catalog, icebergsync.DeadLettersTable)
	if tbl == nil {
		t.Fatal("no dead_letters table")
	}
	arr, err := tbl.Scan(table.WithSelectedFields("reason", "source_file", "source_line", "record")).ToArrowTable(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer arr.Release()
	var got []string
	tr := array.NewTableReader(arr, 1024)
	defer tr.Release()
	for tr.Next() {
		rec := tr.RecordBatch()
		for i := range int(rec.NumRows()) {
			got = append(got, fmt.Sprintf("%s|%s|%d|%s", rec.Column(0).ValueStr(i), rec.Column(1).ValueStr(i),
				rec.Column(2).(*array.Int64).Value(i), rec.Column(3).(*array.String).Value(i)))
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if len(want) == 0 || int64(len(want)) != added || !slices.Equal(got, want) {
		t.Errorf("dead_letters table (%d rows, %d added):\n%s\nsql's (%d):\n%s", len(got), added, strings.Join(got, "\n"), len(want), strings.Join(want, "\n"))
	}
}
