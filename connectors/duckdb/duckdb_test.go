package duckdb

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

func TestMain(m *testing.M) {
	// The S3 client keeps idle connections (BenchmarkIntegrationOpenViewsS3).
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"))
}

// writeManifest writes entries as root's local manifest.
func writeManifest(t testing.TB, root string, entries []schemas.ShardEntry) {
	t.Helper()
	var buf bytes.Buffer
	for _, e := range entries {
		line, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(line)
		buf.WriteByte('\n')
	}
	if err := os.MkdirAll(filepath.Join(root, "_manifest"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "_manifest", "shards.jsonl"), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func dlLine(t *testing.T, reason schemas.Reason, line int64, record string) string {
	t.Helper()
	d := schemas.DeadLetter{Reason: reason, Error: string(reason) + ": detail", Source: schemas.Source{File: "in.jsonl", Line: line}, Record: []byte(record)}
	b, err := json.Marshal(d.Line())
	if err != nil {
		t.Fatal(err)
	}
	return string(b) + "\n"
}

func queryStrings(t *testing.T, d *DB, q string) []string {
	t.Helper()
	rows, err := d.Query(context.Background(), q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestEmptyRoot: a folder without a manifest has every view, empty, and
// steps has the columns of the shard schema.
func TestEmptyRoot(t *testing.T) {
	ctx := context.Background()
	d, err := OpenLocal(ctx, t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if len(d.Warnings()) != 1 || !strings.Contains(d.Warnings()[0], "no manifest") {
		t.Errorf("warnings %q, want one about the missing manifest", d.Warnings())
	}
	for _, v := range []string{"steps", "trajectories", "groups", "shards", "dead_letters"} {
		got := queryStrings(t, d, "SELECT count(*)::VARCHAR FROM "+v)
		if len(got) != 1 || got[0] != "0" {
			t.Errorf("%s: count %q, want 0", v, got)
		}
	}
	cols, err := d.Columns(ctx, "steps")
	if err != nil {
		t.Fatal(err)
	}
	if len(cols) != schemas.NumColumns+1 {
		t.Fatalf("steps has %d columns, want %d", len(cols), schemas.NumColumns+1)
	}
	for i, f := range schemas.StepSchema.Fields() {
		if cols[i].Name != f.Name {
			t.Errorf("column %d: %s, want %s", i, cols[i].Name, f.Name)
		}
	}
	for _, r := range Reports() {
		q, err := Report(r.Name, ReportOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rows, err := d.Query(ctx, q)
		if err != nil {
			t.Fatalf("report %s over nothing: %v", r.Name, err)
		}
		n, err := WriteRows(&bytes.Buffer{}, rows, FormatJSONL)
		rows.Close()
		if err != nil {
			t.Fatalf("report %s: %v", r.Name, err)
		}
		want := 0
		if r.Name == ReportPassAtK {
			want = 1 // the mean row
		}
		if n != want {
			t.Errorf("report %s over nothing: %d rows, want %d", r.Name, n, want)
		}
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestDeadLettersCommittedPrefix: only the bytes the latest manifest entry
// commits of each dead-letter file are read; a file no entry names is
// not; a torn tail is not.
func TestDeadLettersCommittedPrefix(t *testing.T) {
	root := filepath.Join(t.TempDir(), "out d'été")
	if err := os.MkdirAll(filepath.Join(root, "_dlq"), 0o755); err != nil {
		t.Fatal(err)
	}
	a1 := dlLine(t, schemas.ReasonMalformedJSON, 3, "not json")
	a2 := dlLine(t, schemas.ReasonLate, 7, `{"type":"step"}`)
	a3 := dlLine(t, schemas.ReasonMissingField, 9, `{"x":"é"}`) // committed by no entry
	b1 := dlLine(t, schemas.ReasonInvalidValue, 1, "{}")
	if err := os.WriteFile(filepath.Join(root, "_dlq", "run-a.jsonl"), []byte(a1+a2+a3+`{"reason":"torn`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "_dlq", "run-b.jsonl"), []byte(b1), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "_dlq", "run-c.jsonl"), []byte(b1), 0o644); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	writeManifest(t, root, []schemas.ShardEntry{
		{RunID: "a", CommittedAt: t0, DeadLetters: &schemas.DeadLetterState{File: "_dlq/run-a.jsonl", Bytes: int64(len(a1))}},
		// Commits run concurrently: seq 1 committed after seq 2.
		{RunID: "a", CommittedAt: t0.Add(3 * time.Second), DeadLetters: &schemas.DeadLetterState{File: "_dlq/run-a.jsonl", Bytes: int64(len(a1 + a2))}},
		{RunID: "b", CommittedAt: t0.Add(2 * time.Second), DeadLetters: &schemas.DeadLetterState{File: "_dlq/run-b.jsonl", Bytes: int64(len(b1))}},
		{RunID: "d", CommittedAt: t0.Add(4 * time.Second), DeadLetters: &schemas.DeadLetterState{File: "_dlq/run-d.jsonl", Bytes: 10}}, // missing
	})
	before := snapshot(t, root)
	ctx := context.Background()
	d, err := OpenLocal(ctx, root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if w := d.Warnings(); len(w) != 1 || !strings.Contains(w[0], "run-d.jsonl") {
		t.Errorf("warnings %q, want one about the missing run-d.jsonl", w)
	}
	got := queryStrings(t, d, "SELECT concat_ws('|', reason, stream, position, record, dlq_file) FROM dead_letters ORDER BY dlq_file, position")
	want := []string{
		"malformed_json|in.jsonl|3|not json|_dlq/run-a.jsonl",
		`late|in.jsonl|7|{"type":"step"}|_dlq/run-a.jsonl`,
		"invalid_value|in.jsonl|1|{}|_dlq/run-b.jsonl",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("dead letters:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Each line goes to the entry whose mark first covers it; the report
	// follows commit time, not seq.
	got = queryStrings(t, d, "SELECT concat_ws('|', seq, strftime(committed_at, '%S'), dlq_file, reason, dead_letters) FROM dead_letter_commits ORDER BY seq")
	want = []string{
		"0|05|_dlq/run-a.jsonl|malformed_json|1",
		"1|08|_dlq/run-a.jsonl|late|1",
		"2|07|_dlq/run-b.jsonl|invalid_value|1",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("dead_letter_commits:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	q, err := Report(ReportDeadLettersOverTime, ReportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got = queryStrings(t, d, "SELECT concat_ws('|', seq, reason, dead_letters, cumulative_dead_letters) FROM ("+q+")")
	// Every reason at every entry, in commit-time order (seq 0 at :05,
	// 2 at :07, 1 at :08).
	want = []string{
		"0|invalid_value|0|0", "0|late|0|0", "0|malformed_json|1|1",
		"2|invalid_value|1|1", "2|late|0|0", "2|malformed_json|0|1",
		"1|invalid_value|0|1", "1|late|1|1", "1|malformed_json|0|1",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("dead-letters-over-time:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if after := snapshot(t, root); after != before {
		t.Errorf("the output root changed:\nbefore %s\nafter  %s", before, after)
	}
	// The copy of run-a's committed prefix lives in the temporary folder
	// and goes with Close.
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.work); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary folder %s left behind (%v)", d.work, err)
	}
}

// snapshot lists the files under root with their sizes and times.
func snapshot(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %d %s %v;", p, info.Size(), info.ModTime().Format(time.RFC3339Nano), info.Mode())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// passAtKExact is 1 - C(n-c,k)/C(n,k) in exact rational arithmetic.
func passAtKExact(n, c, k int64) (float64, bool) {
	if k > n {
		return 0, false
	}
	num := new(big.Int).Binomial(n-c, k) // 0 when k > n-c
	den := new(big.Int).Binomial(n, k)
	r := new(big.Rat).SetFrac(num, den)
	r.Sub(big.NewRat(1, 1), r)
	f, _ := r.Float64()
	return f, true
}

// TestPassAtK runs the report over a synthetic trajectories table and
// compares every estimate with exact binomial arithmetic, including large
// n where the binomials overflow float64.
func TestPassAtK(t *testing.T) {
	ctx := context.Background()
	d, err := OpenLocal(ctx, t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	type task struct{ n, c int64 }
	tasks := map[string]task{}
	var values []string
	add := func(name string, n, c int64) {
		tasks[name] = task{n, c}
		values = append(values, fmt.Sprintf("('%s', %d, %d)", name, n, c))
	}
	for n := int64(1); n <= 9; n++ {
		for c := int64(0); c <= n; c++ {
			add(fmt.Sprintf("t%02d-%02d", n, c), n, c)
		}
	}
	add("big-a", 200, 3)
	add("big-b", 1500, 700)
	add("big-c", 1000, 1)
	db := d.SQL()
	for _, q := range []string{
		"DROP VIEW groups", "DROP VIEW trajectories",
		"CREATE TABLE spec(task_id VARCHAR, n BIGINT, c BIGINT)",
		"INSERT INTO spec VALUES " + strings.Join(values, ", "),
		"CREATE TABLE trajectories AS SELECT task_id, i < c AS pass FROM spec, range(n) r(i)",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	ks := []int{1, 2, 3, 5, 8, 100}
	q, err := Report(ReportPassAtK, ReportOptions{K: append(ks, 2)})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := d.Query(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if _, err := WriteRows(&out, rows, FormatJSONL); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != len(tasks)+1 {
		t.Fatalf("%d rows, want %d", len(lines), len(tasks)+1)
	}
	sums := make([]float64, len(ks))
	counts := make([]int, len(ks))
	for i, l := range lines {
		var row map[string]any
		dec := json.NewDecoder(strings.NewReader(l))
		dec.UseNumber()
		if err := dec.Decode(&row); err != nil {
			t.Fatal(err)
		}
		name := row["task_id"].(string)
		if i == len(lines)-1 {
			if name != "(mean)" || row["n"] != nil || row["c"] != nil {
				t.Errorf("last row %s, want the mean row", l)
			}
			for j, k := range ks {
				want := sums[j] / float64(counts[j])
				got, _ := row[fmt.Sprintf("pass@%d", k)].(json.Number).Float64()
				if math.Abs(got-want) > 1e-12 {
					t.Errorf("mean pass@%d = %v, want %v", k, got, want)
				}
			}
			continue
		}
		tk, ok := tasks[name]
		if !ok {
			t.Fatalf("unknown task %q", name)
		}
		if fmt.Sprint(row["n"]) != fmt.Sprint(tk.n) || fmt.Sprint(row["c"]) != fmt.Sprint(tk.c) {
			t.Errorf("%s: n=%v c=%v, want %d %d", name, row["n"], row["c"], tk.n, tk.c)
		}
		if len(row) != 3+len(ks) {
			t.Errorf("%s: columns %v, want task_id, n, c and pass@k of %v", name, row, ks)
		}
		for j, k := range ks {
			v := row[fmt.Sprintf("pass@%d", k)]
			want, defined := passAtKExact(tk.n, tk.c, int64(k))
			if !defined {
				if v != nil {
					t.Errorf("%s pass@%d = %v, want null (k > n)", name, k, v)
				}
				continue
			}
			got, err := v.(json.Number).Float64()
			if err != nil {
				t.Fatalf("%s pass@%d = %v", name, k, v)
			}
			if math.Abs(got-want) > 1e-12 {
				t.Errorf("%s (n=%d c=%d) pass@%d = %.17g, want %.17g", name, tk.n, tk.c, k, got, want)
			}
			sums[j] += got
			counts[j]++
		}
	}
	if _, err := Report(ReportPassAtK, ReportOptions{K: []int{0}}); err == nil {
		t.Error("k = 0 accepted")
	}
	if _, err := Report("nope", ReportOptions{}); !errors.Is(err, ErrUnknownReport) {
		t.Errorf("unknown report: %v", err)
	}
}

// TestWriteRows checks the three formats on awkward values.
func TestWriteRows(t *testing.T) {
	ctx := context.Background()
	d, err := OpenLocal(ctx, t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const q = `SELECT * FROM (VALUES
  (1, 0.1::DOUBLE, 'a,"b"', [1, 2]::INTEGER[], MAP {'x': 1.5::DOUBLE}, TIMESTAMPTZ '2026-01-02 03:04:05.123456+00', true, 1.5::FLOAT),
  (22, 'nan'::DOUBLE, E'line\nbreak', NULL, NULL, NULL, NULL, NULL)
) AS t(id, x, s, l, m, ts, b, f) ORDER BY id`
	run := func(format string) string {
		rows, err := d.Query(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var buf bytes.Buffer
		n, err := WriteRows(&buf, rows, format)
		if err != nil {
			t.Fatal(err)
		}
		if n != 2 {
			t.Errorf("%s: %d rows", format, n)
		}
		return buf.String()
	}
	wantJSONL := `{"id":1,"x":0.1,"s":"a,\"b\"","l":[1,2],"m":{"x":1.5},"ts":"2026-01-02T03:04:05.123456Z","b":true,"f":1.5}
{"id":22,"x":null,"s":"line\nbreak","l":null,"m":null,"ts":null,"b":null,"f":null}
`
	if got := run(FormatJSONL); got != wantJSONL {
		t.Errorf("jsonl:\n%s\nwant:\n%s", got, wantJSONL)
	}
	wantCSV := "id,x,s,l,m,ts,b,f\n1,0.1,\"a,\"\"b\"\"\",\"[1,2]\",\"{\"\"x\"\":1.5}\",2026-01-02T03:04:05.123456Z,true,1.5\n22,NaN,\"line\nbreak\",,,,,\n"
	if got := run(FormatCSV); got != wantCSV {
		t.Errorf("csv:\n%q\nwant:\n%q", got, wantCSV)
	}
	wantTable := `id    x  s            l      m          ts                           b        f
--  ---  -----------  -----  ---------  ---------------------------  ----  ----
 1  0.1  a,"b"        [1,2]  {"x":1.5}  2026-01-02T03:04:05.123456Z  true   1.5
22  NaN  line\nbreak  NULL   NULL       NULL                         NULL  NULL
(2 rows)
`
	if got := run(FormatTable); got != wantTable {
		t.Errorf("table:\n%s\nwant:\n%s", got, wantTable)
	}
	if _, err := d.Query(ctx, "SELECT nope FROM steps"); !errors.Is(err, ErrBadQuery) {
		t.Errorf("unknown column: %v, want ErrBadQuery", err)
	}
	if _, err := d.Query(ctx, "SELEKT 1"); !errors.Is(err, ErrBadQuery) {
		t.Errorf("syntax error: %v, want ErrBadQuery", err)
	}
}

func TestScanLines(t *testing.T) {
	for _, c := range []struct {
		name     string
		in       string
		longest  int
		complete int64
	}{
		{"empty", "", 0, 0},
		{"one", "ab\n", 3, 3},
		{"torn", "ab\ncdef", 3, 3},
		{"two", "a\nbcd\n", 4, 6},
		{"long", strings.Repeat("x", 3<<20) + "\n", 3<<20 + 1, 3<<20 + 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, n, err := scanLines(context.Background(), strings.NewReader(c.in))
			if err != nil || l != c.longest || n != c.complete {
				t.Errorf("scanLines = %d, %d, %v; want %d, %d", l, n, err, c.longest, c.complete)
			}
		})
	}
}

// synthetic replaces the stored_steps and shards views of an empty DB
// with tables holding rows (columns not given are null; the token counts
// are the lengths of the lists), so that the other views and the reports
// run over hand-made data.
func synthetic(t *testing.T, d *DB, cols string, steps []string, shards []string) {
	t.Helper()
	ctx := context.Background()
	for _, q := range []string{
		"CREATE TABLE steps_t AS SELECT * FROM stored_steps",
		"DROP VIEW steps", "DROP VIEW stored_steps",
		"ALTER TABLE steps_t RENAME TO stored_steps", // shards is a table already
		"DELETE FROM shards",
		"CREATE VIEW steps AS SELECT * EXCLUDE (prompt_tokens, response_tokens) FROM stored_steps",
		"INSERT INTO stored_steps (" + cols + ") VALUES " + strings.Join(steps, ", "),
		"UPDATE stored_steps SET prompt_tokens = len(prompt_ids), response_tokens = len(response_ids)",
		"INSERT INTO shards (seq, path) VALUES " + strings.Join(shards, ", "),
	} {
		if _, err := d.SQL().ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", clip(q, 300), err)
		}
	}
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// reportRows runs a report and returns its rows as JSON lines.
func reportRows(t *testing.T, d *DB, name string) []string {
	t.Helper()
	q, err := Report(name, ReportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := d.Query(context.Background(), q)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	defer rows.Close()
	var buf bytes.Buffer
	if _, err := WriteRows(&buf, rows, FormatJSONL); err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(buf.String()), "\n")
}

// TestReportsByHand runs the reports over small hand-made data whose
// answers are worked out in the comments.
func TestReportsByHand(t *testing.T) {
	d, err := OpenLocal(context.Background(), t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const cols = "group_id, group_version, trajectory_id, task_id, step_index, prompt_ids, response_ids, reward, is_correct, advantage, estimator, shard"
	row := func(g string, v int, tr string, step, prompt, response int, reward float64, correct string, adv float64, est, shard string) string {
		ids := func(n int) string {
			s := make([]string, n)
			for i := range s {
				s[i] = "7"
			}
			return "[" + strings.Join(s, ",") + "]"
		}
		return fmt.Sprintf("('%s', %d, '%s', 'task-%s', %d, %s, %s, %v, %s, %v, '%s', '%s')", g, v, tr, g, step, ids(prompt), ids(response), reward, correct, adv, est, shard)
	}
	steps := []string{
		// Shard A (seq 10), version 2: group g1; trajectory a has two
		// steps listed out of order: its advantage is step 0's (0.5).
		row("g1", 2, "a", 1, 1, 1, 1, "NULL", -9, "grpo", "A"),
		row("g1", 2, "a", 0, 2, 2, 1, "NULL", 0.5, "grpo", "A"),
		row("g1", 2, "b", 0, 3, 3, 0, "NULL", -0.5, "grpo", "A"),
		// Shard B (seq 11), version 0: stale by 2.
		row("g2", 0, "c", 0, 4, 4, 0.5, "false", 0, "grpo", "B"),
		row("g2", 0, "d", 0, 5, 5, 0, "true", 0, "grpo", "B"),
		// Shard C (seq 12), version 5; D (seq 13), version 3: stale by 2;
		// E (seq 14), version 5.
		row("g3", 5, "e", 0, 6, 6, 2, "NULL", 3, "rloo", "C"),
		row("g4", 3, "f", 0, 7, 7, 0, "NULL", -2, "rloo", "D"),
		row("g4", 3, "g", 0, 8, 8, 0, "NULL", 0, "rloo", "D"),
		row("g5", 5, "h", 0, 9, 9, 1, "NULL", 7, "rloo", "E"),
		row("g5", 5, "i", 0, 10, 10, 0, "NULL", 1, "rloo", "E"),
	}
	synthetic(t, d, cols, steps, []string{"(10, 'A')", "(11, 'B')", "(12, 'C')", "(13, 'D')", "(14, 'E')"})

	for _, c := range []struct {
		report string
		want   []string
	}{
		// staleness: newest by shard A..E = 2, 2, 5, 5, 5; groups g1..g5
		// are 0, 2, 0, 2, 0 behind.
		{ReportStaleness, []string{
			`{"staleness":0,"groups":3,"share":0.6}`,
			`{"staleness":2,"groups":2,"share":0.4}`,
		}},
		// token-lengths: 10 steps, lengths 1..10; quantile_cont at q is
		// 1 + 9q: 5.5, 9.1, 9.91.
		{ReportTokenLengths, []string{
			`{"tokens":"prompt","steps":10,"mean":5.5,"p50":5.5,"p90":9.1,"p99":9.91,"min":1,"max":10}`,
			`{"tokens":"response","steps":10,"mean":5.5,"p50":5.5,"p90":9.1,"p99":9.91,"min":1,"max":10}`,
		}},
		// advantage over trajectories: grpo {0.5, -0.5, 0, 0}: mean 0,
		// population std sqrt(0.125), p01 = -0.5 + 0.03·0.5, p99 = 0 +
		// 0.97·0.5; rloo {3, -2, 0, 7, 1}: mean 1.8, std sqrt(9.36),
		// sorted -2 0 1 3 7: p01 = -2 + 0.04·2, p50 = 1, p99 = 3 + 0.96·4.
		{ReportAdvantage, []string{
			`{"estimator":"grpo","trajectories":4,"mean":0,"std":0.3535533905932738,"min":-0.5,"p01":-0.485,"p50":0,"p99":0.485,"max":0.5,"zero_fraction":0.5}`,
			`{"estimator":"rloo","trajectories":5,"mean":1.8,"std":3.059411708155671,"min":-2,"p01":-1.92,"p50":1,"p99":6.84,"max":7,"zero_fraction":0.2}`,
		}},
		// reward-by-version: v0 {0.5, 0} with is_correct false, true: 1
		// pass; v2 {1, 0}: reward > 0 passes a; v3 {0, 0}; v5 {2, 1, 0}.
		{ReportRewardByVersion, []string{
			`{"group_version":0,"groups":1,"trajectories":2,"mean_reward":0.25,"pass_rate":0.5}`,
			`{"group_version":2,"groups":1,"trajectories":2,"mean_reward":0.5,"pass_rate":0.5}`,
			`{"group_version":3,"groups":1,"trajectories":2,"mean_reward":0,"pass_rate":0}`,
			`{"group_version":5,"groups":2,"trajectories":3,"mean_reward":1,"pass_rate":0.6666666666666666}`,
		}},
	} {
		got := reportRows(t, d, c.report)
		if len(got) != len(c.want) {
			t.Errorf("%s: %d rows, want %d:\n%s", c.report, len(got), len(c.want), strings.Join(got, "\n"))
			continue
		}
		for i := range got {
			if !jsonClose(t, got[i], c.want[i]) {
				t.Errorf("%s row %d:\n got %s\nwant %s", c.report, i, got[i], c.want[i])
			}
		}
	}
	got := queryStrings(t, d, "SELECT concat_ws('|', trajectory_id, steps, prompt_tokens, advantage, pass) FROM trajectories WHERE group_id = 'g1' ORDER BY 1")
	if want := "a|2|3|0.5|true,b|1|3|-0.5|false"; strings.Join(got, ",") != want {
		t.Errorf("trajectories of g1: %s, want %s", strings.Join(got, ","), want)
	}
	got = queryStrings(t, d, "SELECT concat_ws('|', group_id, trajectories, steps, reward_mean, reward_std, reward_min, reward_max, passes) FROM groups WHERE group_id IN ('g1', 'g5') ORDER BY 1")
	if want := "g1|2|3|0.5|0.5|0.0|1.0|1,g5|2|2|0.5|0.5|0.0|1.0|1"; strings.Join(got, ",") != want {
		t.Errorf("groups: %s, want %s", strings.Join(got, ","), want)
	}
}

// jsonClose compares two JSON objects, numbers within 1e-12.
func jsonClose(t *testing.T, a, b string) bool {
	t.Helper()
	var x, y map[string]any
	if err := json.Unmarshal([]byte(a), &x); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal([]byte(b), &y); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	if len(x) != len(y) {
		return false
	}
	for k, v := range x {
		w, ok := y[k]
		if !ok {
			return false
		}
		fv, ok1 := v.(float64)
		fw, ok2 := w.(float64)
		if ok1 && ok2 {
			if math.Abs(fv-fw) > 1e-12 {
				return false
			}
			continue
		}
		if v != w {
			return false
		}
	}
	return true
}

// TestThroughputFollowsCommitTime: shard commits run concurrently, so a
// later seq can commit earlier. The throughput and filtered-over-time
// reports accumulate in commit-time order (ties by seq): cumulative rows
// never go back in time.
func TestThroughputFollowsCommitTime(t *testing.T) {
	d, err := OpenLocal(context.Background(), t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	synthetic(t, d, "group_id, group_version, trajectory_id, step_index, reward, filter_reason, shard",
		[]string{"('g0', 0, 'a', 0, 1, 'zero_variance', 's0')", "('g1', 0, 'a', 0, 1, 'zero_variance', 's1')",
			"('g2', 0, 'a', 0, 1, 'zero_variance', 's2')", "('g3', 0, 'a', 0, 1, 'zero_variance', 's3')"},
		[]string{"(0, 's0')", "(1, 's1')", "(2, 's2')", "(3, 's3')"})
	// seq 0 at :01 (10 rows), 1 at :04 (20), 2 at :02 (30), 3 at :02 (40).
	if _, err := d.SQL().Exec(`UPDATE shards SET "rows" = (seq + 1) * 10,
  committed_at = TIMESTAMPTZ '2026-01-02 03:04:00+00' + to_seconds([1, 4, 2, 2][seq + 1])`); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(reportRows(t, d, ReportThroughput), "\n")
	want := strings.Join([]string{
		`{"seq":0,"committed_at":"2026-01-02T03:04:01Z","rows":10,"groups":null,"cumulative_rows":10,"rows_per_second":null}`,
		`{"seq":2,"committed_at":"2026-01-02T03:04:02Z","rows":30,"groups":null,"cumulative_rows":40,"rows_per_second":30}`,
		`{"seq":3,"committed_at":"2026-01-02T03:04:02Z","rows":40,"groups":null,"cumulative_rows":80,"rows_per_second":null}`,
		`{"seq":1,"committed_at":"2026-01-02T03:04:04Z","rows":20,"groups":null,"cumulative_rows":100,"rows_per_second":10}`,
	}, "\n")
	if got != want {
		t.Errorf("throughput:\n%s\nwant:\n%s", got, want)
	}
	var seqs []string
	for _, r := range reportRows(t, d, ReportFilteredOverTime) {
		var m map[string]any
		if err := json.Unmarshal([]byte(r), &m); err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, fmt.Sprintf("%v:%v", m["seq"], m["cumulative_groups"]))
	}
	if g := strings.Join(seqs, " "); g != "0:1 2:2 3:3 1:4" {
		t.Errorf("filtered-over-time (seq:cumulative) %s, want 0:1 2:2 3:3 1:4", g)
	}
}
