package duckdb

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// writeStepFile writes a Parquet file of StepSchema's columns (but
// without drop) holding one step per id, with DuckDB outside any sandbox.
func writeStepFile(t testing.TB, file string, ids []string, drop ...string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("duckdb", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var cols []string
	for _, f := range schemas.StepSchema.Fields() {
		if strings.Contains(" "+strings.Join(drop, " ")+" ", " "+f.Name+" ") {
			continue
		}
		typ, err := duckType(f.Type)
		if err != nil {
			t.Fatal(err)
		}
		v := "NULL"
		switch f.Name {
		case "step_id", "trajectory_id", "group_id":
			v = "id"
		case "step_index", "group_version", "policy_version":
			v = "0"
		case "prompt_ids", "response_ids":
			v = "[1, 2, 3]"
		case "prompt_prefix_len":
			v = "0"
		case "prompt_delta_ids":
			v = "[]"
		}
		cols = append(cols, fmt.Sprintf("%s::%s AS %s", v, typ, f.Name))
	}
	var values []string
	for _, id := range ids {
		values = append(values, "("+sqlString(id)+")")
	}
	q := fmt.Sprintf("COPY (SELECT %s FROM (VALUES %s) AS t(id)) TO %s (FORMAT parquet)",
		strings.Join(cols, ", "), strings.Join(values, ", "), sqlString(file))
	if _, err := db.Exec(q); err != nil {
		t.Fatalf("%s: %v", clip(q, 300), err)
	}
}

// TestViewsReadEverySchemaVersion: shards of the current schema version
// are read with one binding, and shards of an older version, missing the
// newer columns, beside them by name. Reading them all as one version
// fails ("column not found"), so the grouping is what makes this pass.
func TestViewsReadEverySchemaVersion(t *testing.T) {
	root := t.TempDir()
	old := []string{"prompt_prefix_len", "prompt_delta_ids", "messages_delta"}
	files := []struct {
		path, version string
		ids           []string
		drop          []string
	}{
		{"policy=0/a.parquet", schemas.SchemaVersion, []string{"a1", "a2"}, nil},
		{"policy=0/b.parquet", "3", []string{"b1"}, old},
		{"policy=0/c.parquet", schemas.SchemaVersion, []string{"c1"}, nil},
		{"policy=0/d.parquet", "", []string{"d1"}, old},
	}
	var entries []schemas.ShardEntry
	for _, f := range files {
		writeStepFile(t, filepath.Join(root, filepath.FromSlash(f.path)), f.ids, f.drop...)
		entries = append(entries, schemas.ShardEntry{Path: f.path, Rows: int64(len(f.ids)), SchemaVersion: f.version, RunID: "r"})
	}
	writeManifest(t, root, entries)
	d, err := OpenLocal(context.Background(), root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	got := strings.Join(queryStrings(t, d, "SELECT step_id || ':' || len(prompt_ids) || ':' || shard FROM steps ORDER BY step_id"), " ")
	want := "a1:3:policy=0/a.parquet a2:3:policy=0/a.parquet b1:3:policy=0/b.parquet c1:3:policy=0/c.parquet d1:3:policy=0/d.parquet"
	if got != want {
		t.Fatalf("steps: %s, want %s", got, want)
	}
	got = strings.Join(queryStrings(t, d, "SELECT step_id || ':' || coalesce(prompt_prefix_len::VARCHAR, 'null') FROM stored_steps ORDER BY step_id"), " ")
	if want := "a1:0 a2:0 b1:null c1:0 d1:null"; got != want {
		t.Fatalf("stored_steps prompt_prefix_len: %s, want %s", got, want)
	}
	got = strings.Join(queryStrings(t, d, "SELECT seq || ':' || path || ':' || coalesce(schema_version, 'null') FROM shards"), " ")
	if want := "0:policy=0/a.parquet:4 1:policy=0/b.parquet:3 2:policy=0/c.parquet:4 3:policy=0/d.parquet:null"; got != want {
		t.Fatalf("shards: %s, want %s", got, want)
	}
}

// TestViewsOnEveryConnection: the views read their files from variables
// of each connection, so connections opened after the views, several at
// once as the ui's requests hold them, read every shard too; the
// sandbox still refuses a file beside the shards.
func TestViewsOnEveryConnection(t *testing.T) {
	root := t.TempDir()
	var entries []schemas.ShardEntry
	for i, v := range []string{schemas.SchemaVersion, "3", schemas.SchemaVersion} {
		rel := fmt.Sprintf("policy=0/s%d.parquet", i)
		var drop []string
		if v == "3" {
			drop = []string{"prompt_prefix_len", "prompt_delta_ids", "messages_delta"}
		}
		writeStepFile(t, filepath.Join(root, filepath.FromSlash(rel)), []string{fmt.Sprintf("s%d-a", i), fmt.Sprintf("s%d-b", i)}, drop...)
		entries = append(entries, schemas.ShardEntry{Path: rel, Rows: 2, SchemaVersion: v, RunID: "r"})
	}
	writeStepFile(t, filepath.Join(root, "policy=0", "orphan.parquet"), []string{"o"})
	writeManifest(t, root, entries)
	ctx := context.Background()
	d, err := OpenLocal(ctx, root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	conns := make([]*sql.Conn, 4)
	for i := range conns {
		if conns[i], err = d.SQL().Conn(ctx); err != nil {
			t.Fatal(err)
		}
		defer conns[i].Close()
	}
	for i, c := range conns {
		var n int
		if err := c.QueryRowContext(ctx, "SELECT count(*) FROM steps").Scan(&n); err != nil || n != 6 {
			t.Errorf("connection %d: %d steps (%v), want 6", i, n, err)
		}
		// Every query binds the views again: the footers stay cached on
		// every connection.
		var cache string
		if err := c.QueryRowContext(ctx, "SELECT current_setting('parquet_metadata_cache')::VARCHAR").Scan(&cache); err != nil || cache != "true" {
			t.Errorf("connection %d: parquet_metadata_cache %q (%v), want true", i, cache, err)
		}
		orphan := sqlString(filepath.Join(root, "policy=0", "orphan.parquet"))
		if err := c.QueryRowContext(ctx, "SELECT count(*) FROM read_parquet("+orphan+")").Scan(&n); err == nil {
			t.Errorf("connection %d read a file the manifest does not list", i)
		}
	}
}

// TestViewsSQLInADatabaseFile: the statements ViewsSQL prints, run in a
// DuckDB database file, keep working once it is closed and opened again
// (no variable of the session they were made in), over shards of two
// schema versions.
func TestViewsSQLInADatabaseFile(t *testing.T) {
	root := t.TempDir()
	var entries []schemas.ShardEntry
	for i, v := range []string{schemas.SchemaVersion, "3"} {
		rel := fmt.Sprintf("policy=0/s%d.parquet", i)
		var drop []string
		if v == "3" {
			drop = []string{"prompt_prefix_len", "prompt_delta_ids", "messages_delta"}
		}
		writeStepFile(t, filepath.Join(root, filepath.FromSlash(rel)), []string{fmt.Sprintf("s%d", i)}, drop...)
		entries = append(entries, schemas.ShardEntry{Path: rel, Rows: 1, SchemaVersion: v, RunID: "r"})
	}
	writeManifest(t, root, entries)
	d, err := OpenLocal(context.Background(), root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	script, err := d.ViewsSQL()
	d.Close()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "views.duckdb")
	for round := range 2 {
		db, err := sql.Open("duckdb", file)
		if err != nil {
			t.Fatal(err)
		}
		if round == 0 {
			if _, err := db.Exec(script); err != nil {
				db.Close()
				t.Fatalf("running the printed views: %v", err)
			}
		}
		var n int
		err = db.QueryRow("SELECT count(*) FROM steps").Scan(&n)
		db.Close()
		if err != nil || n != 2 {
			t.Fatalf("round %d: %d steps (%v), want 2", round, n, err)
		}
	}
}

// remoteOnly hides a local reader's root, so Open downloads its shards as
// from S3.
type remoteOnly struct{ store.Reader }

// TestOpenRemoteProgress: opening a remote output reports the bytes of
// shards downloaded out of those to download, ending at the total, and
// nothing to download when the copies are already there.
func TestOpenRemoteProgress(t *testing.T) {
	root := t.TempDir()
	var entries []schemas.ShardEntry
	var total int64
	for i, ids := range [][]string{{"a1", "a2"}, {"b1"}, {"c1", "c2", "c3"}} {
		rel := fmt.Sprintf("policy=0/part-w-%06d.parquet", i)
		file := filepath.Join(root, filepath.FromSlash(rel))
		writeStepFile(t, file, ids)
		info, err := os.Stat(file)
		if err != nil {
			t.Fatal(err)
		}
		total += info.Size()
		entries = append(entries, schemas.ShardEntry{Path: rel, Rows: int64(len(ids)), Bytes: info.Size(), SchemaVersion: schemas.SchemaVersion, RunID: "w"})
	}
	writeManifest(t, root, entries)
	r, err := local.OpenReader(root)
	if err != nil {
		t.Fatal(err)
	}
	keep := t.TempDir()
	for round, want := range []int64{total, 0} {
		var mu sync.Mutex
		var calls, last, of int64
		d, err := OpenRemote(context.Background(), remoteOnly{r}, Options{DownloadDir: keep, Progress: func(done, total int64) {
			mu.Lock()
			defer mu.Unlock()
			calls++
			last, of = max(last, done), total
		}})
		if err != nil {
			t.Fatal(err)
		}
		got := queryStrings(t, d, "SELECT count(*)::VARCHAR FROM steps")
		d.Close()
		if got[0] != "6" {
			t.Fatalf("round %d: %v steps, want 6", round, got)
		}
		if last != want || of != want || calls == 0 {
			t.Fatalf("round %d: progress %d of %d in %d calls, want %d of %d", round, last, of, calls, want, want)
		}
	}
}

// TestTrajectoriesDeterministicOnCollidingKeys: two shards holding the same
// trajectory key with other values (two runs with overlapping ids in one
// root) give the same answer every time: the values of the first shard.
func TestTrajectoriesDeterministicOnCollidingKeys(t *testing.T) {
	root := t.TempDir()
	var entries []schemas.ShardEntry
	for i, rel := range []string{"policy=0/b.parquet", "policy=0/a.parquet", "policy=0/c.parquet"} {
		file := filepath.Join(root, filepath.FromSlash(rel))
		writeStepFile(t, file, []string{"t1", "t2"})
		// Give each file its own reward and task for the same keys.
		db, err := sql.Open("duckdb", "")
		if err != nil {
			t.Fatal(err)
		}
		tmp := file + ".tmp.parquet"
		// The files other than a.parquet hold each trajectory twice more,
		// as later steps: their step and token counts must not add up.
		more := ""
		if i != 1 {
			more = fmt.Sprintf(" UNION ALL SELECT * EXCLUDE (k) REPLACE (%d::DOUBLE AS reward, 'task-%d' AS task_id, step_index + k AS step_index) FROM read_parquet(%s), range(1, 3) r(k)",
				i+1, i, sqlString(file))
		}
		// a.parquet has no termination reason; the others have one, which
		// must not stand in for a's.
		term := "'ENV_DONE'"
		if i == 1 {
			term = "NULL::VARCHAR"
		}
		more = strings.ReplaceAll(more, "AS task_id,", "AS task_id, "+term+" AS termination_reason,")
		q := fmt.Sprintf("COPY (SELECT * REPLACE (%d::DOUBLE AS reward, 'task-%d' AS task_id, %s AS termination_reason) FROM read_parquet(%s)%s) TO %s (FORMAT parquet)",
			i+1, i, term, sqlString(file), more, sqlString(tmp))
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
		db.Close()
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
		entries = append(entries, schemas.ShardEntry{Path: rel, Rows: 2, SchemaVersion: schemas.SchemaVersion, RunID: "w"})
	}
	writeManifest(t, root, entries)
	for range 5 {
		d, err := OpenLocal(context.Background(), root, Options{})
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Join(queryStrings(t, d, "SELECT trajectory_id || ':' || task_id || ':' || reward || ':' || shard || ':' || steps || ':' || coalesce(termination_reason, '-') FROM trajectories ORDER BY trajectory_id"), " ")
		tokens := strings.Join(queryStrings(t, d, `SELECT (t.response_tokens = s.n)::VARCHAR FROM trajectories t
  JOIN (SELECT trajectory_id, sum(len(response_ids)) AS n FROM steps WHERE shard = 'policy=0/a.parquet' GROUP BY ALL) s USING (trajectory_id) ORDER BY trajectory_id`), " ")
		g := strings.Join(queryStrings(t, d, "SELECT group_id || ':' || task_id || ':' || shard FROM groups ORDER BY group_id"), " ")
		d.Close()
		// a.parquet (reward 2, task-1) sorts first.
		if want := "t1:task-1:2.0:policy=0/a.parquet:1:- t2:task-1:2.0:policy=0/a.parquet:1:-"; got != want {
			t.Fatalf("trajectories: %s, want %s", got, want)
		}
		if tokens != "true true" {
			t.Fatalf("trajectories' response_tokens are not the first shard's: %s", tokens)
		}
		if want := "t1:task-1:policy=0/a.parquet t2:task-1:policy=0/a.parquet"; g != want {
			t.Fatalf("groups: %s, want %s", g, want)
		}
	}
}

// The consumed rows written into a script are the table read_json makes
// of their file: the same column types and values, a NUL in an id
// included (a literal would end there).
func TestConsumedValuesLikeTheFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "consumed.jsonl")
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for i, g := range []string{"g", "a'b\x00c", `back\slash`} {
		if err := enc.Encode(consumedLine{Group: g, Step: i, Position: 0, Groups: 1, Member: "m", MemberID: "m/1", BatchID: 1 << 63,
			PolicyVersion: 1 << 40, GroupID: g + "-id", GroupVersion: 3, Trajectories: 8, Steps: 1 << 35, Shard: "policy=0/x.parquet",
			Ordinal: 2, Seq: 1 << 50, AckedAt: "2026-12-03 05:00:00.123456"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(file, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	inline, err := consumedValuesSQL(file)
	if err != nil {
		t.Fatal(err)
	}
	tables := map[string]string{}
	for name, script := range map[string]string{"file": (&layout{consumed: file}).consumedSQL(), "inline": inline} {
		db, err := sql.Open("duckdb", "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(script); err != nil {
			db.Close()
			t.Fatalf("%s: %v", name, err)
		}
		var desc, rows string
		err = db.QueryRow("SELECT string_agg(column_name || ' ' || column_type, ', ') FROM (DESCRIBE consumed)").Scan(&desc)
		if err == nil {
			err = db.QueryRow("SELECT string_agg(to_json(c)::VARCHAR, ' ') FROM consumed c").Scan(&rows)
		}
		db.Close()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		tables[name] = desc + "\n" + rows
	}
	if tables["file"] != tables["inline"] {
		t.Fatalf("the inline table differs from the file's:\nfile:   %s\ninline: %s", tables["file"], tables["inline"])
	}
}
