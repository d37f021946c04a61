package iceberg

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/apache/iceberg-go"
	"github.com/apache/iceberg-go/table"
	"modernc.org/sqlite"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/pipeline"
	"github.com/rllm-pipe/rllm-pipe/connectors/pipeline/pipelinetest"
	"github.com/rllm-pipe/rllm-pipe/connectors/store/storetest"
	"github.com/rllm-pipe/rllm-pipe/ingest"
)

// commitRuns adds runs more ingest runs to the root at dir/out, each of
// groups new groups (two one-step trajectories each, at versions g%3):
// every run commits at least one shard per version it holds.
func commitRuns(t testing.TB, dir string, first, runs, groups int) string {
	t.Helper()
	ctx := context.Background()
	root := filepath.Join(dir, "out")
	for r := range runs {
		var lines []string
		for g := range groups {
			lines = append(lines, pipelinetest.GroupLines((first+r)*groups+g)...)
		}
		in := filepath.Join(dir, fmt.Sprintf("in-%d.jsonl", first+r))
		if err := os.WriteFile(in, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		st, err := local.Open(root, fmt.Sprintf("run-%d", first+r))
		if err != nil {
			t.Fatal(err)
		}
		src, err := ingest.OpenFile(in, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		p := pipeline.New(pipelinetest.Config(t), st, nil)
		if err := p.Run(ctx, ctx, src, src.Stream()); err != nil {
			t.Fatal(err)
		}
		src.Close()
		st.Close()
	}
	return root
}

// testCatalog is the catalog at dir/catalog.db through driverName (the
// plain SQLite driver, or a wrapper of it that can crash the process).
func testCatalog(t testing.TB, dir, driverName string) *Catalog {
	t.Helper()
	c, err := openSQLite(driverName, filepath.Join(dir, "catalog.db"), DefaultCatalogName,
		iceberg.Properties{"warehouse": "file://" + filepath.Join(dir, "warehouse")})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newSyncer(t testing.TB, cat *Catalog, root string, maxFiles int) *Syncer {
	t.Helper()
	return newSyncerIn(t, cat, root, maxFiles, "rllm")
}

// newSyncerIn is newSyncer into namespace ns.
func newSyncerIn(t testing.TB, cat *Catalog, root string, maxFiles int, ns string) *Syncer {
	t.Helper()
	r, err := local.OpenReader(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	s, err := NewSyncer(cat, r, Config{Namespace: []string{ns}, Base: "file://" + root + "/", MaxFilesPerCommit: maxFiles})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tableFiles reads the table back: each data file's path (under root)
// and how many times the table lists it, and its rows in all.
func tableFiles(t *testing.T, cat *Catalog, root, ns string) (map[string]int, int64) {
	t.Helper()
	tbl, err := cat.LoadTable(context.Background(), []string{ns, StepsTable})
	if err != nil {
		t.Fatal(err)
	}
	tasks, err := tbl.Scan().PlanFiles(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]int{}
	var rows int64
	for _, task := range tasks {
		files[strings.TrimPrefix(task.File.FilePath(), "file://"+root+"/")]++
		rows += task.File.Count()
	}
	return files, rows
}

// committed is the root's committed shards, in manifest order.
func committed(t *testing.T, root string) []string {
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

// checkExactlyOnce fails t unless the table holds exactly the first n
// committed shards, each once, and its position says n.
func checkExactlyOnce(t *testing.T, cat *Catalog, root string, n int) {
	t.Helper()
	checkExactlyOnceIn(t, cat, root, n, "rllm")
}

func checkExactlyOnceIn(t *testing.T, cat *Catalog, root string, n int, ns string) {
	t.Helper()
	files, _ := tableFiles(t, cat, root, ns)
	want := committed(t, root)[:n]
	for _, p := range want {
		if files[p] != 1 {
			t.Errorf("shard %s listed %d times", p, files[p])
		}
	}
	for p := range files {
		if !slices.Contains(want, p) {
			t.Errorf("the table lists %s, not among the first %d committed shards", p, n)
		}
	}
	tbl, err := cat.LoadTable(context.Background(), []string{ns, StepsTable})
	if err != nil {
		t.Fatal(err)
	}
	pos, err := Position(tbl)
	if err != nil || pos.Shards != n || (n > 0 && pos.LastShard != want[n-1]) {
		t.Errorf("position %+v (%v), want %d shards up to %s", pos, err, n, want[max(n-1, 0)])
	}
}

// TestSyncExactlyOnce: every committed shard lands once, in commits of
// at most MaxFilesPerCommit; a re-run adds nothing; shards committed
// later are added by the next sync, and only they.
func TestSyncExactlyOnce(t *testing.T) {
	dir := t.TempDir()
	root := commitRuns(t, dir, 0, 3, 6)
	cat := testCatalog(t, dir, "sqlite")
	defer cat.Close()
	n := len(committed(t, root))
	res, err := newSyncer(t, cat, root, 2).Sync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Shards != n || res.Commits != (n+1)/2 || res.Rows != 3*6*2 || res.Position != n {
		t.Fatalf("first sync %+v; want %d shards of 36 rows in %d commits", res, n, (n+1)/2)
	}
	checkExactlyOnce(t, cat, root, n)
	if res, err := newSyncer(t, cat, root, 2).Sync(context.Background()); err != nil || res.Shards != 0 || res.Commits != 0 {
		t.Fatalf("a re-run: %+v, %v; want nothing added", res, err)
	}
	commitRuns(t, dir, 3, 2, 6)
	m := len(committed(t, root))
	res, err = newSyncer(t, cat, root, 100).Sync(context.Background())
	if err != nil || res.Shards != m-n || res.Rows != 2*6*2 || res.Commits != 1 {
		t.Fatalf("after more commits: %+v, %v; want %d shards in one commit", res, err, m-n)
	}
	checkExactlyOnce(t, cat, root, m)
	// The table refuses another root.
	other := commitRuns(t, t.TempDir(), 0, 1, 2)
	if _, err := newSyncer(t, cat, other, 100).Sync(context.Background()); err == nil || !strings.Contains(err.Error(), "projects") {
		t.Errorf("syncing another root into the table: %v", err)
	}
}

// TestSyncersRace: four syncers at once over one catalog, one shard per
// commit: each shard lands once; the losers of each race recompute.
func TestSyncersRace(t *testing.T) {
	dir := t.TempDir()
	syncersRace(t, dir, func() *Catalog { return testCatalog(t, dir, "sqlite") }, "rllm")
}

// TestIntegrationPostgresCatalog: the same race over the SQL catalog on
// a real PostgreSQL (scripts/services.sh starts one; RLLM_PG_URL).
func TestIntegrationPostgresCatalog(t *testing.T) {
	uri := os.Getenv("RLLM_PG_URL")
	if uri == "" {
		t.Skip("RLLM_PG_URL not set: run `make test` (it starts PostgreSQL)")
	}
	dir := t.TempDir()
	var b [4]byte
	_, _ = rand.Read(b[:])
	ns := "test_" + hex.EncodeToString(b[:])
	open := func() *Catalog {
		c, err := OpenCatalog(context.Background(), uri, "", iceberg.Properties{"warehouse": "file://" + filepath.Join(dir, "warehouse")})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	syncersRace(t, dir, open, ns)
}

func syncersRace(t *testing.T, dir string, open func() *Catalog, ns string) {
	root := commitRuns(t, dir, 0, 4, 3)
	n := len(committed(t, root))
	var wg sync.WaitGroup
	results := make([]Result, 4)
	errs := make([]error, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cat := open()
			defer cat.Close()
			results[i], errs[i] = newSyncerIn(t, cat, root, 1, ns).Sync(context.Background())
		}()
	}
	wg.Wait()
	added, conflicts := 0, 0
	for i := range 4 {
		if errs[i] != nil {
			t.Fatalf("syncer %d: %v", i, errs[i])
		}
		added += results[i].Shards
		conflicts += results[i].Conflicts
	}
	cat := open()
	defer cat.Close()
	checkExactlyOnceIn(t, cat, root, n, ns)
	if added != n {
		t.Errorf("the syncers added %d shards together, the root has %d", added, n)
	}
	t.Logf("%d shards, %d commits lost a race", n, conflicts)
}

// TestSplitShardOfSeveralVersions: a shard holding several versions is
// added as one file per version, each in its identity partition, the rows
// all there once.
func TestSplitShardOfSeveralVersions(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	var lines []string
	for g := range 9 {
		lines = append(lines, pipelinetest.GroupLines(g)...)
	}
	in := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(in, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "out")
	st, err := local.Open(root, "run-1")
	if err != nil {
		t.Fatal(err)
	}
	src, err := ingest.OpenFile(in, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	cfg := pipelinetest.Config(t)
	cfg.MaxPartitions, cfg.FlushInterval = 1, 0
	p := pipeline.New(cfg, st, nil)
	if err := p.Run(ctx, ctx, src, src.Stream()); err != nil {
		t.Fatal(err)
	}
	src.Close()
	st.Close()
	if n := len(committed(t, root)); n != 1 {
		t.Fatalf("%d shards; the test wants one of three versions", n)
	}
	cat := testCatalog(t, dir, "sqlite")
	defer cat.Close()
	res, err := newSyncer(t, cat, root, 10).Sync(ctx)
	if err != nil || res.Split != 1 || res.Rows != 18 {
		t.Fatalf("sync: %+v, %v; want one shard split, 18 rows", res, err)
	}
	tbl, err := cat.LoadTable(ctx, []string{"rllm", StepsTable})
	if err != nil {
		t.Fatal(err)
	}
	for v := range 3 {
		scan := tbl.Scan(table.WithRowFilter(iceberg.EqualTo(iceberg.Reference("group_version"), int64(v))))
		tasks, err := scan.PlanFiles(ctx)
		if err != nil || len(tasks) != 1 {
			t.Fatalf("version %d: %d files (%v); want its own", v, len(tasks), err)
		}
		if tasks[0].File.Count() != 6 {
			t.Errorf("version %d: %d rows, want 6", v, tasks[0].File.Count())
		}
		arr, err := scan.ToArrowTable(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if arr.NumRows() != 6 {
			t.Errorf("version %d reads %d rows", v, arr.NumRows())
		}
		arr.Release()
	}
}

// crashDriver wraps SQLite so that a test can kill the process at each
// statement the catalog runs inside its commit.
type crashDriver struct{ driver.Driver }

// sqlConn is what the SQLite driver's connections are.
type sqlConn interface {
	driver.Conn
	driver.ExecerContext
	driver.QueryerContext
	driver.ConnBeginTx
}

func (d crashDriver) Open(name string) (driver.Conn, error) {
	c, err := d.Driver.Open(name)
	if err != nil {
		return nil, err
	}
	return crashConn{c.(sqlConn)}, nil
}

type crashConn struct{ sqlConn }

func (c crashConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	if w := strings.ToLower(strings.Fields(q + " x")[0]); w == "update" || w == "insert" {
		step("sql " + w)
	}
	return c.sqlConn.ExecContext(ctx, q, args)
}

func (c crashConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	tx, err := c.sqlConn.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return crashTx{tx}, nil
}

type crashTx struct{ driver.Tx }

func (t crashTx) Commit() error {
	step("sql commit")
	return t.Tx.Commit()
}

func init() {
	sql.Register("sqlite-crash", crashDriver{&sqlite.Driver{}})
}

const killChildEnv = "RLLM_ICEBERG_KILL_CHILD"

type killSpec struct {
	Dir, Root string
	At        int
}

// TestSyncKilledAtEveryStep kills a sync (SIGKILL) before each step of
// its protocol in turn — loading the table, reading the footers, staging
// the commit, each SQL statement of the catalog's commit and its COMMIT,
// after it — then syncs again: the table always holds the first shards
// of the manifest, each once, and finally all of them.
func TestSyncKilledAtEveryStep(t *testing.T) {
	if spec := os.Getenv(killChildEnv); spec != "" {
		var k killSpec
		if err := json.Unmarshal([]byte(spec), &k); err != nil {
			t.Fatal(err)
		}
		n := 0
		crashPoint = func(name string) {
			n++
			fmt.Printf("step %d %s\n", n, name)
			if n == k.At {
				storetest.Die()
			}
		}
		cat := testCatalog(t, k.Dir, "sqlite-crash")
		defer cat.Close()
		if _, err := newSyncer(t, cat, k.Root, 2).Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
		return
	}
	dir := t.TempDir()
	root := commitRuns(t, dir, 0, 3, 4)
	n := len(committed(t, root))
	steps := map[string]bool{}
	for at := 1; ; at++ {
		spec, _ := json.Marshal(killSpec{Dir: dir, Root: root, At: at})
		lines, killed := storetest.Reenter(t, "TestSyncKilledAtEveryStep", killChildEnv, string(spec))
		for _, l := range lines {
			if f := strings.Fields(l); len(f) >= 3 && f[0] == "step" {
				steps[strings.Join(f[2:], " ")] = true
			}
		}
		cat := testCatalog(t, dir, "sqlite")
		tbl, err := cat.LoadTable(context.Background(), []string{"rllm", StepsTable})
		if err == nil {
			pos, err := Position(tbl)
			if err != nil {
				t.Fatal(err)
			}
			checkExactlyOnce(t, cat, root, pos.Shards)
		}
		cat.Close()
		if !killed {
			break
		}
		if at > 500 {
			t.Fatal("the child never finished")
		}
	}
	for _, s := range []string{"load", "create", "files", "commit", "sql update", "sql commit", "committed"} {
		if !steps[s] {
			t.Errorf("no kill before step %q (steps seen: %v)", s, steps)
		}
	}
	cat := testCatalog(t, dir, "sqlite")
	defer cat.Close()
	checkExactlyOnce(t, cat, root, n)
}

// TestSchemaEvolves: a table made when the shards had fewer columns
// gains the new ones at the next sync (Iceberg schema evolution, the
// table kept), and reads the shards' values in them.
func TestSchemaEvolves(t *testing.T) {
	dir := t.TempDir()
	root := commitRuns(t, dir, 0, 1, 3)
	cat := testCatalog(t, dir, "sqlite")
	defer cat.Close()
	ctx := context.Background()
	full, err := TableSchema()
	if err != nil {
		t.Fatal(err)
	}
	// The schema before prompt deltas (schema 3): no prompt_prefix_len,
	// prompt_delta_ids or messages_delta.
	var old []iceberg.NestedField
	for _, f := range full.Fields() {
		if f.Name != "prompt_prefix_len" && f.Name != "prompt_delta_ids" && f.Name != "messages_delta" {
			old = append(old, f)
		}
	}
	sc := iceberg.NewSchema(0, old...)
	if err := cat.CreateNamespace(ctx, table.Identifier{"rllm"}, nil); err != nil {
		t.Fatal(err)
	}
	made, err := cat.CreateTable(ctx, table.Identifier{"rllm", StepsTable}, sc)
	if err != nil {
		t.Fatal(err)
	}
	uuid := made.Metadata().TableUUID()
	if _, err := newSyncer(t, cat, root, 100).Sync(ctx); err != nil {
		t.Fatal(err)
	}
	tbl, err := cat.LoadTable(ctx, table.Identifier{"rllm", StepsTable})
	if err != nil {
		t.Fatal(err)
	}
	if tbl.Metadata().TableUUID() != uuid {
		t.Error("the table was replaced, not evolved")
	}
	for _, name := range []string{"prompt_prefix_len", "prompt_delta_ids", "messages_delta"} {
		if _, ok := tbl.Schema().FindFieldByName(name); !ok {
			t.Errorf("column %s not added", name)
		}
	}
	arr, err := tbl.Scan(table.WithSelectedFields("step_id", "prompt_prefix_len")).ToArrowTable(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer arr.Release()
	if arr.NumRows() != 6 || arr.Column(1).NullN() != 0 {
		t.Errorf("%d rows, %d null prompt_prefix_len: want 6 rows, their values read", arr.NumRows(), arr.Column(1).NullN())
	}
}

// TestPositionOutlivesAForeignRewriteAndExpiry: another engine rewrites a
// file (a snapshot without our position) and the snapshots ours made
// expire; the next sync still knows where it was (the table's
// properties) and adds exactly the shards committed since.
func TestPositionOutlivesAForeignRewriteAndExpiry(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	root := commitRuns(t, dir, 0, 2, 3)
	cat := testCatalog(t, dir, "sqlite")
	defer cat.Close()
	if _, err := newSyncer(t, cat, root, 1).Sync(ctx); err != nil {
		t.Fatal(err)
	}
	n := len(committed(t, root))
	id := table.Identifier{"rllm", StepsTable}
	tbl, err := cat.LoadTable(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	// The rewrite: the first shard's file replaced by a copy of it.
	first := committed(t, root)[0]
	body, err := os.ReadFile(filepath.Join(root, first))
	if err != nil {
		t.Fatal(err)
	}
	cp := filepath.Join(dir, "rewritten.parquet")
	if err := os.WriteFile(cp, body, 0o644); err != nil {
		t.Fatal(err)
	}
	txn := tbl.NewTransaction()
	if err := txn.ReplaceDataFiles(ctx, []string{"file://" + root + "/" + first}, []string{"file://" + cp}, nil); err != nil {
		t.Fatal(err)
	}
	if tbl, err = txn.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	txn = tbl.NewTransaction()
	if err := txn.ExpireSnapshots(table.WithRetainLast(1), table.WithOlderThan(0)); err != nil {
		t.Fatal(err)
	}
	if tbl, err = txn.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if len(tbl.Metadata().Snapshots()) != 1 {
		t.Fatalf("%d snapshots left; the test wants only the rewrite's", len(tbl.Metadata().Snapshots()))
	}
	if pos, err := Position(tbl); err != nil || pos.Shards != n {
		t.Fatalf("position %+v, %v after the expiry; want %d shards", pos, err, n)
	}
	commitRuns(t, dir, 2, 1, 3)
	m := len(committed(t, root))
	res, err := newSyncer(t, cat, root, 100).Sync(ctx)
	if err != nil || res.Shards != m-n {
		t.Fatalf("sync after the expiry: %+v, %v; want the %d new shards", res, err, m-n)
	}
	files, _ := tableFiles(t, cat, root, "rllm")
	if len(files) != m || files[first] != 0 {
		t.Errorf("the table lists %d files (the first shard %d times); want %d, the first as its copy", len(files), files[first], m)
	}
}
