package duckdb

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/connectors/termtext"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// sandboxRoot makes an output root with one committed shard (two steps of
// one trajectory, the first id holding terminal escapes) and one
// committed dead-letter file, beside a host file that is not part of it.
// It returns the root and the host file.
func sandboxRoot(t *testing.T) (root, secret string) {
	t.Helper()
	dir := t.TempDir()
	root = filepath.Join(dir, "out")
	secret = filepath.Join(dir, "secret.csv")
	if err := os.WriteFile(secret, []byte("host secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"policy=1", "_dlq"} {
		if err := os.MkdirAll(filepath.Join(root, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Write the shard with a DuckDB of our own: the empty steps view has
	// the shard schema's columns.
	ctx := context.Background()
	w, err := OpenLocal(ctx, t.TempDir(), Options{AllowHostFiles: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	shard := filepath.Join(root, "policy=1", "shard-0.parquet")
	for _, q := range []string{
		"CREATE TABLE t AS SELECT * EXCLUDE (shard) FROM steps",
		`INSERT INTO t (group_id, task_id, trajectory_id, step_id, step_index, num_steps, policy_version, group_version,
  prompt_ids, response_ids, response_logprobs, reward, advantage, group_size, expected_group_size, partial, is_correct, estimator) VALUES
  ('g1', 'task' || chr(27) || '[2J', 'tr' || chr(27) || ']0;pwned' || chr(7) || chr(13) || chr(8238), 's0', 0, 2, 1, 1, [1, 2], [3], [-0.5], 1.0, 0.5, 1, 1, false, true, 'grpo'),
  ('g1', 'task' || chr(27) || '[2J', 'tr' || chr(27) || ']0;pwned' || chr(7) || chr(13) || chr(8238), 's1', 1, 2, 1, 1, [1], [4, 5], [-0.1, -0.2], 1.0, 0.5, 1, 1, false, true, 'grpo')`,
		"COPY t TO " + sqlString(shard) + " (FORMAT parquet)",
	} {
		if _, err := w.SQL().ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", clip(q, 100), err)
		}
	}
	info, err := os.Stat(shard)
	if err != nil {
		t.Fatal(err)
	}
	dl := dlLine(t, schemas.ReasonMalformedJSON, 3, "not json")
	if err := os.WriteFile(filepath.Join(root, "_dlq", "run-a.jsonl"), []byte(dl), 0o644); err != nil {
		t.Fatal(err)
	}
	writeManifest(t, root, []schemas.ShardEntry{{
		Path: "policy=1/shard-0.parquet", Rows: 2, Bytes: info.Size(), Groups: 1, PolicyVersion: 1, RunID: "a",
		DeadLetters: &schemas.DeadLetterState{File: "_dlq/run-a.jsonl", Bytes: int64(len(dl))},
	}})
	return root, secret
}

// TestSandboxRefusesEscapes: by default a query reaches no file but the
// committed data the views read, changes no setting and runs nothing but
// a query, whatever it tries; the views and every report still work.
func TestSandboxRefusesEscapes(t *testing.T) {
	root, secret := sandboxRoot(t)
	dir := filepath.Dir(root)
	manifest := filepath.Join(root, "_manifest", "shards.jsonl")
	shard := filepath.Join(root, "policy=1", "shard-0.parquet")
	dlq := filepath.Join(root, "_dlq", "run-a.jsonl")
	out := filepath.Join(dir, "written")
	q := sqlString
	before := snapshot(t, root)
	ctx := context.Background()
	d, err := OpenLocal(ctx, root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()

	for _, c := range []struct {
		name, q string
		bad     bool // refused as a bad query is fine too (it cannot bind)
	}{
		{"read_csv host file", "SELECT * FROM read_csv(" + q(secret) + ")", false},
		{"read_text host file", "SELECT content FROM read_text(" + q(secret) + ")", false},
		{"read_text etc", "SELECT content FROM read_text('/etc/passwd')", false},
		{"read_blob manifest", "SELECT content FROM read_blob(" + q(manifest) + ")", false},
		{"read_parquet glob", "SELECT count(*) FROM read_parquet(" + q(root+"/**/*.parquet") + ")", false},
		{"glob root", "SELECT * FROM glob(" + q(root+"/*") + ")", false},
		{"glob etc", "SELECT * FROM glob('/etc/*')", false},
		{"replacement scan", "SELECT * FROM " + q(secret), false},
		{"query function", "SELECT * FROM query('SELECT content FROM read_text(" + strings.ReplaceAll(q(secret), "'", "''") + ")')", false},
		{"http url", "SELECT * FROM read_csv('http://127.0.0.1:9/x.csv')", false},
		{"s3 url", "SELECT * FROM read_parquet('s3://bucket/x.parquet')", false},
		{"copy over manifest", "COPY (SELECT 1 AS x) TO " + q(manifest) + " (FORMAT csv)", false},
		{"copy over shard", "COPY (SELECT 1 AS x) TO " + q(shard) + " (FORMAT parquet, USE_TMP_FILE false)", false},
		{"copy over dead letters", "COPY (SELECT 1 AS x) TO " + q(dlq) + " (FORMAT csv, USE_TMP_FILE false)", false},
		{"copy elsewhere", "COPY (SELECT * FROM steps) TO " + q(out) + " (FORMAT parquet)", false},
		{"copy from", "COPY steps FROM " + q(secret), true},
		{"explain analyze copy", "EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO " + q(shard) + " (FORMAT parquet, USE_TMP_FILE false)", false},
		{"explain commented analyze copy", "EXPLAIN /* a /* nested */ comment */ ANALYZE COPY (SELECT 1 AS x) TO " + q(shard) + " (FORMAT parquet, USE_TMP_FILE false)", false},
		{"export database", "EXPORT DATABASE " + q(out), false},
		{"attach file", "ATTACH " + q(out+".db"), false},
		{"attach memory", "ATTACH ':memory:' AS m2", false},
		{"install", "INSTALL httpfs", false},
		{"load", "LOAD httpfs", false},
		{"set external access", "SET enable_external_access = true", false},
		{"set global external access", "SET GLOBAL enable_external_access = true", false},
		{"reset external access", "RESET enable_external_access", false},
		{"set allowed directories", "SET allowed_directories = ['/']", false},
		{"unlock", "SET lock_configuration = false", false},
		{"reset the lock", "RESET lock_configuration", false},
		{"pragma", "PRAGMA enable_profiling = 'json'", false},
		{"create secret", "CREATE SECRET s (TYPE s3, KEY_ID 'a', SECRET 'b')", false},
		{"create view over file", "CREATE VIEW w AS SELECT content FROM read_text(" + q(secret) + ")", false},
		{"replace a view", "CREATE OR REPLACE VIEW steps AS SELECT 1 AS x", false},
		{"drop a view", "DROP VIEW steps", false},
		{"call", "CALL pragma_version()", false},
		{"several statements", "COPY (SELECT 1 AS x) TO " + q(out) + " (FORMAT csv); SELECT 1", false},
		{"transaction", "BEGIN", false},
		// Functions that change settings past lock_configuration.
		{"enable logging to stdout", "SELECT * FROM enable_logging(level='trace', storage='stdout')", false},
		{"enable logging in a subquery", "SELECT count(*) FROM steps WHERE (SELECT count(*) FROM enable_logging(level='trace', storage='stdout')) = 0", false},
		{"write log", "SELECT write_log(task_id, level:='error', scope:='database', return_value:=1) FROM steps", false},
		{"write log as a method", "SELECT task_id.write_log() FROM steps", false},
		{"enable logging qualified and quoted", `SELECT * FROM system.main."enable_logging"(level='trace')`, false},
		{"enable logging built by query()", "SELECT * FROM query(concat('SELECT * FROM ena', 'ble_logging(level=trace)'))", false},
		{"enable profiling", "SELECT * FROM enable_profiling(save_location:=" + q(out+".json") + ")", false},
		{"explain analyze enable logging", "EXPLAIN ANALYZE SELECT * FROM enable_logging(level='trace')", false},
		{"truncate logs", "SELECT * FROM truncate_duckdb_logs()", false},
		{"checkpoint", "SELECT * FROM force_checkpoint()", false},
		{"setseed", "SELECT setseed(0.5)", false},
		// A plan that cannot be serialised (the dead-letters view reads
		// JSON) falls back to the text: no state function, no SQL built
		// at bind time.
		{"dead letters and enable logging", "SELECT * FROM dead_letters, enable_logging(level='trace')", false},
		{"dead letters and query()", "SELECT * FROM dead_letters, query(concat('SELECT * FROM ena', 'ble_logging()'))", false},
		{"dead letters and a serialised statement", "SELECT * FROM dead_letters, json_execute_serialized_sql(json_serialize_sql('SELECT 1 AS x'))", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			rows, err := d.Query(ctx, c.q)
			if err == nil {
				var buf bytes.Buffer
				_, err = WriteRows(&buf, rows, FormatCSV)
				rows.Close()
				if err == nil {
					t.Fatalf("%s ran:\n%s", c.q, buf.String())
				}
			}
			if !errors.Is(err, ErrRefused) && !(c.bad && errors.Is(err, ErrBadQuery)) {
				t.Errorf("%s: %v, want ErrRefused", c.q, err)
			}
		})
	}
	// The database handed to callers keeps the file and setting limits.
	for _, s := range []string{
		"COPY (SELECT 1 AS x) TO " + q(manifest) + " (FORMAT csv)",
		"CREATE VIEW w AS SELECT content FROM read_text(" + q(secret) + ")",
		"SET enable_external_access = true",
	} {
		if _, err := d.SQL().ExecContext(ctx, s); err == nil {
			t.Errorf("SQL().Exec(%s) ran", s)
		}
	}
	// The refused functions changed nothing, not even while checked.
	for _, c := range []struct{ q, want string }{
		{"SELECT current_setting('enable_logging')::VARCHAR", "0"},
		{"SELECT current_setting('logging_level')::VARCHAR", "INFO"},
		{"SELECT coalesce(current_setting('enable_profiling')::VARCHAR, 'null')", "null"},
	} {
		if got := strings.Join(queryStrings(t, d, c.q), ","); got != c.want {
			t.Errorf("%s: %q, want %q", c.q, got, c.want)
		}
	}
	for _, p := range []string{out, out + ".db", out + ".json", filepath.Join(dir, "written.txt")} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s was written (%v)", p, err)
		}
	}
	if after := snapshot(t, root); after != before {
		t.Errorf("the output root changed:\nbefore %s\nafter  %s", before, after)
	}

	// Queries over the views, and every report, still run.
	for _, c := range []struct{ q, want string }{
		{"SELECT count(*)::VARCHAR FROM steps", "2"},
		{"SELECT count(*)::VARCHAR FROM trajectories", "1"},
		{"SELECT count(*)::VARCHAR FROM groups", "1"},
		{"SELECT path FROM shards", "policy=1/shard-0.parquet"},
		{"SELECT reason FROM dead_letters", "malformed_json"},
		{"-- a comment\nWITH s AS (SELECT * FROM steps) SELECT sum(len(response_ids))::VARCHAR FROM s;", "3"},
		{"SELECT count(*)::VARCHAR FROM (DESCRIBE steps) WHERE column_name = 'reward'", "1"},
		{"SELECT count(*)::VARCHAR FROM read_parquet(" + q(shard) + ")", "2"},
		// The functions' names as text, and functions that only read.
		{"SELECT 'enable_logging(), write_log()' AS checkpoint", "enable_logging(), write_log()"},
		{"SELECT count(*)::VARCHAR FROM duckdb_logs()", "0"},
		{"SELECT * FROM query('SELECT count(*)::VARCHAR FROM steps')", "2"},
		{"SELECT count(*)::VARCHAR FROM dead_letters WHERE reason <> 'enable_logging_query'", "1"},
	} {
		if got := strings.Join(queryStrings(t, d, c.q), ","); got != c.want {
			t.Errorf("%s: %q, want %q", c.q, got, c.want)
		}
	}
	for _, s := range []string{"EXPLAIN SELECT * FROM groups", "explain /* x */ analyze SELECT count(*) FROM steps", "SUMMARIZE steps", "SHOW TABLES", "FROM steps"} {
		rows, err := d.Query(ctx, s)
		if err != nil {
			t.Errorf("%s: %v", s, err)
			continue
		}
		if _, err := WriteRows(&bytes.Buffer{}, rows, FormatJSONL); err != nil {
			t.Errorf("%s: %v", s, err)
		}
		rows.Close()
	}
	for _, r := range Reports() {
		// The training loop's rows are a consumer group's: none here (the
		// report runs all the same: reportRows fails on an error).
		if rows := reportRows(t, d, r.Name); (len(rows) == 0 || rows[0] == "") && r.Name != ReportTrainingLoop && r.Name != ReportStaleSkips {
			t.Errorf("report %s: no rows", r.Name)
		}
	}
	if after := snapshot(t, root); after != before {
		t.Errorf("the output root changed:\nbefore %s\nafter  %s", before, after)
	}
}

// TestSandboxOptOut: AllowHostFiles leaves DuckDB as it is, so a query
// may join a host file.
func TestSandboxOptOut(t *testing.T) {
	root, secret := sandboxRoot(t)
	d, err := OpenLocal(context.Background(), root, Options{AllowHostFiles: true})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	got := queryStrings(t, d, "SELECT rtrim(content, chr(10)) FROM read_text("+sqlString(secret)+") CROSS JOIN (SELECT count(*) FROM steps)")
	if len(got) != 1 || got[0] != "host secret" {
		t.Errorf("read_text with AllowHostFiles: %q", got)
	}
}

// TestExplained: the statement after EXPLAIN [ANALYZE], past comments.
func TestExplained(t *testing.T) {
	for _, c := range []struct {
		q, want string
		ok      bool
	}{
		{"EXPLAIN SELECT 1", "SELECT 1", true},
		{" -- c\n explain\tANALYZE SELECT 1", " SELECT 1", true},
		{"EXPLAIN/* a /* b */ c */ANALYSE/**/SELECT 1", "/**/SELECT 1", true},
		{"EXPLAIN --x\rANALYZE COPY", " COPY", true},
		{"EXPLAIN ANALYZEd", "ANALYZEd", true},
		{"EXPLAINX SELECT 1", "", false},
		{"/* open EXPLAIN SELECT 1", "", false},
		{"SELECT 1", "", false},
	} {
		got, ok := explained(c.q)
		if got != c.want || ok != c.ok {
			t.Errorf("explained(%q) = %q, %v; want %q, %v", c.q, got, ok, c.want, c.ok)
		}
	}
}

// TestWriteRowsEscapesControls: a table shows control characters and
// bidirectional overrides escaped, in values and in column names; jsonl
// escapes them too and csv keeps them, both reading back exactly.
func TestWriteRowsEscapesControls(t *testing.T) {
	root, _ := sandboxRoot(t)
	ctx := context.Background()
	d, err := OpenLocal(ctx, root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const id = "tr\x1b]0;pwned\a\r\u202e"
	q := `SELECT DISTINCT trajectory_id, task_id AS "col` + "\x1b[31m" + `", chr(155) || 'c1' AS c1, 'é' || chr(8294) AS bidi FROM steps`
	write := func(format string) string {
		t.Helper()
		rows, err := d.Query(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var buf bytes.Buffer
		if _, err := WriteRows(&buf, rows, format); err != nil {
			t.Fatal(err)
		}
		return buf.String()
	}
	unsafe := func(s string) []rune {
		var bad []rune
		for _, r := range s {
			if r != '\n' && termtext.NeedsEscape(r) {
				bad = append(bad, r)
			}
		}
		return bad
	}

	table := write(FormatTable)
	if bad := unsafe(table); len(bad) > 0 {
		t.Errorf("table holds control characters %q:\n%s", bad, table)
	}
	for _, want := range []string{`tr\x1b]0;pwned\x07\r\u202e`, `col\x1b[31m`, `task\x1b[2J`, `\u009bc1`, `é\u2066`} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %s:\n%s", want, table)
		}
	}

	jl := write(FormatJSONL)
	if bad := unsafe(jl); len(bad) > 0 {
		t.Errorf("jsonl holds control characters %q:\n%s", bad, jl)
	}
	var row map[string]string
	if err := json.Unmarshal([]byte(jl), &row); err != nil {
		t.Fatalf("jsonl %s: %v", jl, err)
	}
	if row["trajectory_id"] != id || row["col\x1b[31m"] != "task\x1b[2J" || row["c1"] != "\u009bc1" || row["bidi"] != "é\u2066" {
		t.Errorf("jsonl reads back %q", row)
	}

	recs, err := csv.NewReader(strings.NewReader(write(FormatCSV))).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{{"trajectory_id", "col\x1b[31m", "c1", "bidi"}, {id, "task\x1b[2J", "\u009bc1", "é\u2066"}}
	if !reflect.DeepEqual(recs, want) {
		t.Errorf("csv reads back %q, want %q", recs, want)
	}
}

// TestPrintable: what the table escapes, and what it leaves.
func TestPrintable(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain é 中文 \\x1b", "plain é 中文 \\x1b"},
		{"a\nb\tc\rd", `a\nb\tc\rd`},
		{"\x1b[2J\x00\x7f", `\x1b[2J\x00\x7f`},
		{"\u0085\u009b\u202a\u202e\u2069\u200f\u061c\u2028", `\u0085\u009b\u202a\u202e\u2069\u200f\u061c\u2028`},
		{"bad \xff\xfe utf8 \ufffd", `bad \xff\xfe utf8 ` + "\ufffd"},
	} {
		if got := printable(c.in); got != c.want {
			t.Errorf("printable(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TerminalSafe (error messages) keeps newlines and tabs, and escapes the
// rest as printable does.
func TestTerminalSafeKeepsLines(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain", "plain"},
		{"two\nlines\tand a tab", "two\nlines\tand a tab"},
		{"red \x1b[31m\r", `red \x1b[31m\r`},
		{"bidi \u202e x\xff", `bidi \u202e x\xff`},
	} {
		if got := TerminalSafe(c.in); got != c.want {
			t.Errorf("TerminalSafe(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// ShowLayoutControls (record text in a web page) writes out the
// bidirectional controls and line separators, and keeps everything else:
// newlines, other controls (HTML shows them inertly), invalid bytes.
func TestShowLayoutControls(t *testing.T) {
	all := "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029"
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"plain é 中文 ‐ ‑ \u2065\u2070 \u061b", "plain é 中文 ‐ ‑ \u2065\u2070 \u061b"},
		{"a\nb\tc\x1b\u0085\xff", "a\nb\tc\x1b\u0085\xff"},
		{"run \u202egnp.exe", `run \u202egnp.exe`},
		{all, `\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029`},
		{"x\u2029", `x\u2029`},
	} {
		if got := ShowLayoutControls(c.in); got != c.want {
			t.Errorf("ShowLayoutControls(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestDeadLettersOutsideTheRoot: a manifest may name a dead-letter file
// outside the root (ingest --dlq FILE), by its absolute path. One that
// holds dead letters is shown; any other file (a host file the manifest
// was made to name) is not, and no query can read it.
func TestDeadLettersOutsideTheRoot(t *testing.T) {
	root, secret := sandboxRoot(t)
	dir := filepath.Dir(root)
	shard := filepath.Join(root, "policy=1", "shard-0.parquet")
	info, err := os.Stat(shard)
	if err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(dir, "elsewhere.jsonl")
	dl := dlLine(t, schemas.ReasonMalformedJSON, 7, "outside")
	if err := os.WriteFile(outside, []byte(dl), 0o644); err != nil {
		t.Fatal(err)
	}
	hostJSON := filepath.Join(dir, "host.jsonl")
	if err := os.WriteFile(hostJSON, []byte(`{"token":"host secret"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		file  string
		bytes int64
		shown bool
	}{
		{outside, int64(len(dl)), true},
		{secret, 12, false},   // "host secret\n"
		{hostJSON, 24, false}, // JSON, but not a dead letter
	} {
		t.Run(filepath.Base(c.file), func(t *testing.T) {
			writeManifest(t, root, []schemas.ShardEntry{{
				Path: "policy=1/shard-0.parquet", Rows: 2, Bytes: info.Size(), Groups: 1, PolicyVersion: 1, RunID: "a",
				DeadLetters: &schemas.DeadLetterState{File: c.file, Bytes: c.bytes},
			}})
			ctx := context.Background()
			d, err := OpenLocal(ctx, root, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			n := strings.Join(queryStrings(t, d, "SELECT count(*)::VARCHAR FROM dead_letters"), "")
			rows, err := d.Query(ctx, "SELECT content FROM read_text("+sqlString(c.file)+")")
			if err == nil {
				rows.Close()
			}
			if c.shown {
				if n != "1" || err != nil {
					t.Errorf("dead letters %s, read_text: %v; want 1 dead letter, readable", n, err)
				}
				return
			}
			if n != "0" || !errors.Is(err, ErrRefused) {
				t.Errorf("dead letters %s, read_text: %v; want none shown, read_text refused", n, err)
			}
			if w := strings.Join(d.Warnings(), "\n"); !strings.Contains(w, "not a dead-letter file") {
				t.Errorf("no warning says why: %q", w)
			}
		})
	}
}

// stateChanging are the DuckDB functions that change the database's
// state from inside a query, written out here apart from the sandbox's
// own list (stateFunctions), so that a name dropped from that list is
// caught.
var stateChanging = []string{"enable_logging", "disable_logging", "truncate_duckdb_logs", "write_log",
	"enable_profiling", "enable_profile", "disable_profiling", "disable_profile",
	"checkpoint", "force_checkpoint", "enable_checkpoint_on_shutdown", "disable_checkpoint_on_shutdown", "setseed"}

// TestSandboxRefusesEveryStateFunction calls every function of
// stateChanging and stateFunctions, as DuckDB declares it (scalar or table, with arguments
// of its shortest overload), in a query whose plan is checked and in one
// over dead_letters whose plan cannot be: each is refused, by name (a
// pragma, which only a PRAGMA statement calls, as a PRAGMA).
func TestSandboxRefusesEveryStateFunction(t *testing.T) {
	root, _ := sandboxRoot(t)
	ctx := context.Background()
	d, err := OpenLocal(ctx, root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	names := slices.Clone(stateChanging)
	for _, f := range stateFunctions {
		if !slices.Contains(names, f) {
			names = append(names, f)
		}
	}
	literal := map[string]string{"VARCHAR": "'x'", "DOUBLE": "0.5", "FLOAT": "0.5", "BOOLEAN": "true", "INTEGER": "1", "BIGINT": "1"}
	for _, f := range names {
		t.Run(f, func(t *testing.T) {
			var kind, types string
			err := d.db.QueryRowContext(ctx, `SELECT function_type, array_to_string(parameter_types, ',') FROM duckdb_functions()
				WHERE function_name = ? ORDER BY len(parameter_types) LIMIT 1`, f).Scan(&kind, &types)
			if err != nil {
				t.Fatalf("%s is not a DuckDB function: %v", f, err)
			}
			var args []string
			for _, typ := range strings.Split(types, ",") {
				if typ == "" || f == "enable_logging" { // its parameters are named ones, all optional
					continue
				}
				a, ok := literal[typ]
				if !ok {
					a = "NULL"
				}
				args = append(args, a)
			}
			call := f + "(" + strings.Join(args, ", ") + ")"
			var planned, unplanned string
			switch kind {
			case "table":
				planned = "SELECT * FROM " + call
				unplanned = "SELECT * FROM dead_letters, " + call
			case "scalar":
				planned = "SELECT " + call
				unplanned = "SELECT " + call + " FROM dead_letters"
			case "pragma":
				// Only a PRAGMA statement calls it, and none runs here.
				rows, err := d.Query(ctx, "PRAGMA "+f)
				if err == nil {
					rows.Close()
				}
				if !errors.Is(err, ErrRefused) {
					t.Errorf("PRAGMA %s: %v, want refused", f, err)
				}
				return
			default:
				t.Fatalf("%s is a %s function", f, kind)
			}
			for _, q := range []string{planned, unplanned} {
				rows, err := d.Query(ctx, q)
				if err == nil {
					rows.Close()
					t.Errorf("%s: ran, want refused", q)
					continue
				}
				if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), f) {
					t.Errorf("%s: %v, want refused naming %s", q, err, f)
				}
			}
		})
	}
}
