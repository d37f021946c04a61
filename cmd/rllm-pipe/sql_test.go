package main

// `rllm-pipe sql` through the real binary. A generated shard set (several
// policy versions, two ingest runs with different estimators, partial
// groups, records without is_correct, bad records) is ingested; every
// named report and the trajectories and groups views are run and compared
// with values computed here, in Go, from the committed shards (read with
// connectors/parquet, never with DuckDB) and the committed dead-letter
// lines: pass@k with exact binomials (math/big), quantiles with the
// linear-interpolation definition DuckDB's quantile_cont uses.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/minio/minio-go/v7"

	pqread "github.com/rllm-pipe/rllm-pipe/connectors/parquet"
)

// ---------------------------------------------------------------------------
// The shard set

// sqlInputs generates traces and writes them as two input files (tasks
// split by parity), with alterations that give the reports something to
// find:
//   - tasks ≡ 3 (mod 7) lose one trajectory record: the group is written
//     partial with 3 of 4 trajectories, the orphaned steps are
//     dead-lettered incomplete_trajectory;
//   - tasks ≡ 5 (mod 11) lose three: the group is dead-lettered
//     incomplete_group;
//   - tasks ≡ 0 (mod 3) lose is_correct: pass falls back to reward > 0;
//   - a few bad records in each file.
func sqlInputs(t *testing.T, bin, work string) []string {
	t.Helper()
	gen := filepath.Join(work, "gen.jsonl")
	r := e2eRun(t, bin, work, "gen", "--to", gen, "--groups", "56", "--group-size", "4", "--policy-versions", "6",
		"--seed", "5", "--messages=false", "--prompt-len", "50", "--response-len", "25", "--max-steps", "4", "--quiet")
	if r.code != 0 {
		t.Fatalf("gen: exit %d\n%s", r.code, r.stderr)
	}
	data, err := os.ReadFile(gen)
	if err != nil {
		t.Fatal(err)
	}
	parts := make([][][]byte, 2)
	for _, l := range e2eSplitLines(data) {
		task := genTask(t, l)
		var rec map[string]any
		if err := json.Unmarshal(l, &rec); err != nil {
			t.Fatal(err)
		}
		if rec["type"] == "trajectory" {
			id, _ := rec["trajectory_id"].(string)
			switch {
			case task%7 == 3 && strings.HasSuffix(id, "/r0"):
				continue
			case task%11 == 5 && !strings.HasSuffix(id, "/r3"):
				continue
			case task%3 == 0:
				if _, ok := rec["is_correct"]; !ok {
					t.Fatalf("generated trajectory %s has no is_correct: the test would not cover the fallback", id)
				}
				delete(rec, "is_correct")
				if l, err = json.Marshal(rec); err != nil {
					t.Fatal(err)
				}
			}
		}
		parts[task%2] = append(parts[task%2], l)
	}
	bad := [][]string{
		{`not json`, `[1,2]`, `{"type":"bogus","x":1}`, `{"type":"step"}`, `{"type":"step"`},
		{`{"type":"trajectory","trajectory_id":"x","task_id":"t","reward":"high","num_steps":1}`, `"just a string"`},
	}
	var files []string
	for i, p := range parts {
		for j, b := range bad[i] {
			at := (j + 1) * len(p) / (len(bad[i]) + 1)
			p = append(p[:at], append([][]byte{[]byte(b)}, p[at:]...)...)
		}
		f := filepath.Join(work, fmt.Sprintf("part-%d.jsonl", i))
		if err := os.WriteFile(f, e2eJoinLines(p), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

// sqlIngestArgs are the two runs: GRPO with the zero-variance filter, then
// RLOO in verl's conventions (so the advantage report has two estimators).
var sqlIngestArgs = [][]string{
	{"--filter", "zero-variance"},
	{"--estimator", "rloo", "--compat", "verl"},
}

// sqlIngest ingests the files one after the other into to and returns the
// summed dead letters by reason and groups written, from --stats-json.
func sqlIngest(t *testing.T, bin, work, to string, env []string, files []string, extra ...string) (map[string]int64, int64) {
	t.Helper()
	dead := map[string]int64{}
	var groups int64
	for i, f := range files {
		args := append([]string{"--from", f, "--to", to, "--group-size", "4", "--min-group-size", "2",
			"--shard-size", "24KiB", "--flush-interval", "30ms"}, sqlIngestArgs[i]...)
		st := ingestWithStats(t, bin, work, env, append(args, extra...)...)
		for k, v := range st.DeadLetters {
			dead[k] += v
		}
		groups += st.GroupsEmitted
	}
	return dead, groups
}

// sqlRun runs the binary with env (nil: e2eEnv()).
func sqlRun(t *testing.T, bin, dir string, env []string, args ...string) e2eRunResult {
	t.Helper()
	if env == nil {
		return e2eRun(t, bin, dir, args...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir, cmd.Env = dir, env
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	res := e2eRunResult{stdout: so.String(), stderr: se.String()}
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("running %s %q: %v", bin, args, err)
		}
		res.code = ee.ExitCode()
	}
	return res
}

// ---------------------------------------------------------------------------
// The independent computation

// sqlShard is a committed shard: its manifest path and a local copy.
// sqlShard is a shard of the manifest: record is its record's place in
// an object-store manifest (the shards of one group commit share it),
// and its own place in a local one.
type sqlShard struct {
	path, file string
	record     int64
}

type sqlTraj struct {
	group, task, id, role, estimator, shard, filter, termination string
	version, minPV, maxPV                                        int64
	reward, advantage                                            float64
	firstStep                                                    int32
	isCorrect                                                    *bool
	partial                                                      bool
	steps, promptTokens, responseTokens, numSteps, expected      int64
}

func (tr *sqlTraj) pass() bool {
	if tr.isCorrect != nil {
		return *tr.isCorrect
	}
	return tr.reward > 0
}

// sqlRef is what the reports should say.
type sqlRef struct {
	trajs           map[string]*sqlTraj // group|version|trajectory
	order           []string            // shard paths in manifest order
	records         []int64             // their records (sqlShard.record)
	shardOf         map[string]string   // group|version → shard path
	promptLens      []float64           // per step
	responseLens    []float64
	rows            int64
	deadLetters     map[string]int64
	deadLetterLines int
}

func sqlKey(parts ...any) string { return fmt.Sprint(parts...) }

// sqlReadShards reads the shards (in manifest order) with connectors/parquet.
func sqlReadShards(t *testing.T, shards []sqlShard) *sqlRef {
	t.Helper()
	ref := &sqlRef{trajs: map[string]*sqlTraj{}, shardOf: map[string]string{}, deadLetters: map[string]int64{}}
	cols := []string{"group_id", "task_id", "role", "trajectory_id", "step_index", "num_steps", "policy_version", "group_version",
		"prompt_ids", "response_ids", "reward", "advantage", "expected_group_size", "partial", "termination_reason",
		"is_correct", "filter_reason", "estimator"}
	for _, s := range shards {
		ref.order = append(ref.order, s.path)
		ref.records = append(ref.records, s.record)
		err := pqread.ReadFile(context.Background(), s.file, cols, memory.DefaultAllocator, func(rec arrow.RecordBatch) error {
			col := func(name string) arrow.Array {
				idx := rec.Schema().FieldIndices(name)
				if len(idx) != 1 {
					t.Fatalf("%s: column %s not read", s.path, name)
				}
				return rec.Column(idx[0])
			}
			str := func(name string, i int) string {
				a := col(name).(*array.String)
				if a.IsNull(i) {
					return ""
				}
				return a.Value(i)
			}
			listLen := func(name string, i int) int64 {
				lo, hi := col(name).(*array.List).ValueOffsets(i)
				return hi - lo
			}
			for i := 0; i < int(rec.NumRows()); i++ {
				group, version, id := str("group_id", i), col("group_version").(*array.Int64).Value(i), str("trajectory_id", i)
				pv := col("policy_version").(*array.Int64).Value(i)
				step := col("step_index").(*array.Int32).Value(i)
				adv := col("advantage").(*array.Float64).Value(i)
				pl, rl := listLen("prompt_ids", i), listLen("response_ids", i)
				k := sqlKey(group, "|", version, "|", id)
				tr := ref.trajs[k]
				if tr == nil {
					tr = &sqlTraj{group: group, task: str("task_id", i), id: id, role: str("role", i), version: version,
						estimator: str("estimator", i), shard: s.path, filter: str("filter_reason", i),
						termination: str("termination_reason", i), minPV: pv, maxPV: pv, firstStep: step, advantage: adv,
						reward:   col("reward").(*array.Float64).Value(i),
						numSteps: int64(col("num_steps").(*array.Int32).Value(i)),
						expected: int64(col("expected_group_size").(*array.Int32).Value(i)),
						partial:  col("partial").(*array.Boolean).Value(i)}
					if ic := col("is_correct").(*array.Boolean); !ic.IsNull(i) {
						v := ic.Value(i)
						tr.isCorrect = &v
					}
					ref.trajs[k] = tr
				}
				gk := sqlKey(group, "|", version)
				if prev, ok := ref.shardOf[gk]; ok && prev != s.path {
					t.Fatalf("group %s in two shards (%s, %s): the expectations assume whole groups per shard", gk, prev, s.path)
				}
				ref.shardOf[gk] = s.path
				tr.steps++
				tr.promptTokens += pl
				tr.responseTokens += rl
				tr.minPV, tr.maxPV = min(tr.minPV, pv), max(tr.maxPV, pv)
				if step < tr.firstStep {
					tr.firstStep, tr.advantage = step, adv
				}
				ref.promptLens = append(ref.promptLens, float64(pl))
				ref.responseLens = append(ref.responseLens, float64(rl))
				ref.rows++
			}
			return nil
		})
		if err != nil {
			t.Fatalf("read %s: %v", s.path, err)
		}
	}
	return ref
}

// addDeadLetters counts the reasons of committed dead-letter lines.
func (ref *sqlRef) addDeadLetters(t *testing.T, data []byte) {
	t.Helper()
	for _, l := range e2eSplitLines(data) {
		var d struct {
			Reason string `json:"reason"`
		}
		if err := json.Unmarshal(l, &d); err != nil {
			t.Fatalf("dead letter %s: %v", e2eClip(string(l), 200), err)
		}
		ref.deadLetters[d.Reason]++
		ref.deadLetterLines++
	}
}

// sqlManifest is the part of a manifest line the reference reads.
type sqlManifest struct {
	Path        string `json:"path"`
	Rows        int64  `json:"rows"`
	DeadLetters *struct {
		File  string `json:"file"`
		Bytes int64  `json:"bytes"`
	} `json:"dead_letters"`
}

// sqlLocalRef reads a local output: its manifest, the shards it lists and
// the committed prefix of each dead-letter file.
func sqlLocalRef(t *testing.T, out string) *sqlRef {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(out, "_manifest", "shards.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var shards []sqlShard
	committed := map[string]int64{}
	var files []string
	for _, l := range e2eSplitLines(data) {
		var m sqlManifest
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatal(err)
		}
		if m.Path != "" {
			shards = append(shards, sqlShard{m.Path, filepath.Join(out, filepath.FromSlash(m.Path)), int64(len(shards))})
		}
		if m.DeadLetters != nil {
			if _, ok := committed[m.DeadLetters.File]; !ok {
				files = append(files, m.DeadLetters.File)
			}
			committed[m.DeadLetters.File] = m.DeadLetters.Bytes
		}
	}
	ref := sqlReadShards(t, shards)
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(out, filepath.FromSlash(f)))
		if err != nil {
			t.Fatal(err)
		}
		ref.addDeadLetters(t, data[:committed[f]])
	}
	return ref
}

// groups folds the trajectories.
type sqlGroup struct {
	version                               int64
	task, shard                           string
	trajectories, steps, passes, expected int64
	partial                               bool
	rewards                               []float64
	mean, std, min, max                   float64
}

func (ref *sqlRef) groups() map[string]*sqlGroup {
	out := map[string]*sqlGroup{}
	for _, tr := range ref.trajs {
		k := sqlKey(tr.group, "|", tr.version)
		g := out[k]
		if g == nil {
			g = &sqlGroup{version: tr.version, task: tr.task, shard: tr.shard, expected: tr.expected}
			out[k] = g
		}
		g.trajectories++
		g.steps += tr.steps
		if tr.pass() {
			g.passes++
		}
		g.partial = g.partial || tr.partial
		g.rewards = append(g.rewards, tr.reward)
	}
	for _, g := range out {
		g.mean = sqlMean(g.rewards)
		g.std = sqlStdPop(g.rewards)
		g.min, g.max = slicesMin(g.rewards), slicesMax(g.rewards)
	}
	return out
}

func sqlMean(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func sqlStdPop(xs []float64) float64 {
	m := sqlMean(xs)
	s := 0.0
	for _, x := range xs {
		s += (x - m) * (x - m)
	}
	return math.Sqrt(s / float64(len(xs)))
}

func slicesMin(xs []float64) float64 {
	m := math.Inf(1)
	for _, x := range xs {
		m = math.Min(m, x)
	}
	return m
}

func slicesMax(xs []float64) float64 {
	m := math.Inf(-1)
	for _, x := range xs {
		m = math.Max(m, x)
	}
	return m
}

// sqlQuantile is the linear-interpolation quantile (Hyndman and Fan type
// 7, numpy's default), the definition of DuckDB's quantile_cont: h =
// (n-1)q, x[floor h] + (h - floor h)(x[ceil h] - x[floor h]).
func sqlQuantile(xs []float64, q float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	h := float64(len(s)-1) * q
	lo, hi := int(math.Floor(h)), int(math.Ceil(h))
	return s[lo] + (h-float64(lo))*(s[hi]-s[lo])
}

// sqlPassAtK is 1 - C(n-c,k)/C(n,k), exactly.
func sqlPassAtK(n, c, k int64) (float64, bool) {
	if k > n {
		return 0, false
	}
	r := new(big.Rat).SetFrac(new(big.Int).Binomial(n-c, k), new(big.Int).Binomial(n, k))
	f, _ := r.Sub(big.NewRat(1, 1), r).Float64()
	return f, true
}

// ---------------------------------------------------------------------------
// Reading and comparing the command's output

// sqlRows runs `rllm-pipe sql --format jsonl` and decodes its rows.
func sqlRows(t *testing.T, bin, dir string, env []string, args ...string) []map[string]any {
	t.Helper()
	args = append([]string{"sql", "--format", "jsonl"}, args...)
	r := sqlRun(t, bin, dir, env, args...)
	if r.code != 0 {
		t.Fatalf("rllm-pipe %s: exit %d\n%s", strings.Join(args, " "), r.code, r.stderr)
	}
	var out []map[string]any
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.UseNumber()
	for {
		var row map[string]any
		if err := dec.Decode(&row); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("rllm-pipe %s: output: %v\n%s", strings.Join(args, " "), err, e2eClip(r.stdout, 2000))
		}
		out = append(out, row)
	}
	return out
}

// sqlCheck compares rows of a report with want, key by key.
type sqlCheck struct {
	t    *testing.T
	what string
	errs int
}

func (c *sqlCheck) fail(format string, args ...any) {
	c.t.Helper()
	c.errs++
	if c.errs <= 30 {
		c.t.Errorf(c.what+": "+format, args...)
	}
}

// num compares a numeric value (relative tolerance 1e-9; DuckDB sums in a
// different order). A nil want means null.
func (c *sqlCheck) num(row map[string]any, key string, want any) {
	c.t.Helper()
	got, present := row[key]
	if !present {
		c.fail("row %v has no %s", row, key)
		return
	}
	if want == nil {
		if got != nil {
			c.fail("%s = %v, want null (row %v)", key, got, row)
		}
		return
	}
	n, ok := got.(json.Number)
	if !ok {
		c.fail("%s = %v (%T), want %v (row %v)", key, got, got, want, row)
		return
	}
	g, err := n.Float64()
	if err != nil {
		c.fail("%s = %v: %v", key, got, err)
		return
	}
	var w float64
	switch x := want.(type) {
	case int:
		w = float64(x)
	case int64:
		w = float64(x)
	case float64:
		w = x
	default:
		c.t.Fatalf("want of type %T", want)
	}
	if math.Abs(g-w) > 1e-9*math.Max(1, math.Max(math.Abs(g), math.Abs(w))) {
		c.fail("%s = %.17g, want %.17g (row %v)", key, g, w, row)
	}
}

func (c *sqlCheck) str(row map[string]any, key string, want any) {
	c.t.Helper()
	got := row[key]
	if want == "" {
		want = nil
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		c.fail("%s = %v, want %v (row %v)", key, got, want, row)
	}
}

func (c *sqlCheck) count(rows []map[string]any, n int) {
	c.t.Helper()
	if len(rows) != n {
		c.t.Fatalf("%s: %d rows, want %d", c.what, len(rows), n)
	}
}

// sqlCheckReports runs every report and view over from and compares them
// with ref.
func sqlCheckReports(t *testing.T, bin, work string, env []string, from []string, ref *sqlRef) {
	t.Helper()
	run := func(args ...string) []map[string]any { return sqlRows(t, bin, work, env, append(from, args...)...) }
	groups := ref.groups()

	// reward-by-version
	{
		c := &sqlCheck{t: t, what: "reward-by-version"}
		type agg struct {
			groups        map[string]bool
			rewards       []float64
			passes, trajs int64
		}
		by := map[int64]*agg{}
		for _, tr := range ref.trajs {
			a := by[tr.version]
			if a == nil {
				a = &agg{groups: map[string]bool{}}
				by[tr.version] = a
			}
			a.groups[tr.group] = true
			a.rewards = append(a.rewards, tr.reward)
			a.trajs++
			if tr.pass() {
				a.passes++
			}
		}
		var versions []int64
		for v := range by {
			versions = append(versions, v)
		}
		sort.Slice(versions, func(i, j int) bool { return versions[i] < versions[j] })
		if len(versions) < 4 {
			t.Fatalf("only %d policy versions in the data", len(versions))
		}
		rows := run("--report", "reward-by-version")
		c.count(rows, len(versions))
		for i, v := range versions {
			a := by[v]
			c.num(rows[i], "group_version", v)
			c.num(rows[i], "groups", len(a.groups))
			c.num(rows[i], "trajectories", a.trajs)
			c.num(rows[i], "mean_reward", sqlMean(a.rewards))
			c.num(rows[i], "pass_rate", float64(a.passes)/float64(a.trajs))
		}
	}

	// pass-at-k, default k and a custom list
	for _, ks := range [][]int64{{1, 2, 4, 8}, {1, 3, 5}} {
		c := &sqlCheck{t: t, what: fmt.Sprintf("pass-at-k %v", ks)}
		type nc struct{ n, c int64 }
		tasks := map[string]*nc{}
		for _, tr := range ref.trajs {
			x := tasks[tr.task]
			if x == nil {
				x = &nc{}
				tasks[tr.task] = x
			}
			x.n++
			if tr.pass() {
				x.c++
			}
		}
		var names []string
		for n := range tasks {
			names = append(names, n)
		}
		sort.Strings(names)
		args := []string{"--report", "pass-at-k"}
		if len(ks) != 4 {
			var s []string
			for _, k := range ks {
				s = append(s, strconv.FormatInt(k, 10))
			}
			args = append(args, "--k", strings.Join(s, ","))
		}
		rows := run(args...)
		c.count(rows, len(names)+1)
		sums, defined := make([]float64, len(ks)), make([]int, len(ks))
		partialSeen, fullSeen := false, false
		for i, name := range names {
			x := tasks[name]
			partialSeen = partialSeen || (x.n > 0 && x.c > 0 && x.c < x.n)
			fullSeen = fullSeen || x.c == x.n
			c.str(rows[i], "task_id", name)
			c.num(rows[i], "n", x.n)
			c.num(rows[i], "c", x.c)
			for j, k := range ks {
				p, ok := sqlPassAtK(x.n, x.c, k)
				if !ok {
					c.num(rows[i], fmt.Sprintf("pass@%d", k), nil)
					continue
				}
				c.num(rows[i], fmt.Sprintf("pass@%d", k), p)
				sums[j] += p
				defined[j]++
			}
		}
		if !partialSeen || !fullSeen {
			t.Fatalf("the data has no task with 0 < c < n or c = n: pass@k is not exercised")
		}
		last := rows[len(rows)-1]
		c.str(last, "task_id", "(mean)")
		c.num(last, "n", nil)
		c.num(last, "c", nil)
		for j, k := range ks {
			if defined[j] == 0 {
				c.num(last, fmt.Sprintf("pass@%d", k), nil)
			} else {
				c.num(last, fmt.Sprintf("pass@%d", k), sums[j]/float64(defined[j]))
			}
		}
	}

	// staleness: running max of group_version over the shards in
	// manifest order.
	{
		c := &sqlCheck{t: t, what: "staleness"}
		shardMax := map[string]int64{}
		for gk, shard := range ref.shardOf {
			v := groups[gk].version
			if m, ok := shardMax[shard]; !ok || v > m {
				shardMax[shard] = v
			}
		}
		// The shards of one record (a group commit) landed at once.
		newest := map[string]int64{}
		running, seen := int64(0), false
		for i := 0; i < len(ref.order); {
			j := i
			for j < len(ref.order) && ref.records[j] == ref.records[i] {
				if m, ok := shardMax[ref.order[j]]; ok && (!seen || m > running) {
					running, seen = m, true
				}
				j++
			}
			for _, p := range ref.order[i:j] {
				newest[p] = running
			}
			i = j
		}
		dist := map[int64]int64{}
		for gk, g := range groups {
			dist[newest[ref.shardOf[gk]]-g.version]++
		}
		var values []int64
		for v := range dist {
			values = append(values, v)
		}
		sort.Slice(values, func(i, j int) bool { return values[i] < values[j] })
		if len(values) < 3 {
			t.Fatalf("staleness takes only the values %v: the data does not exercise the report", values)
		}
		rows := run("--report", "staleness")
		c.count(rows, len(values))
		for i, v := range values {
			c.num(rows[i], "staleness", v)
			c.num(rows[i], "groups", dist[v])
			c.num(rows[i], "share", float64(dist[v])/float64(len(groups)))
		}
	}

	// token-lengths
	{
		c := &sqlCheck{t: t, what: "token-lengths"}
		// Linear interpolation must matter somewhere, or quantile_disc
		// would pass too.
		fractional := false
		for _, lens := range [][]float64{ref.promptLens, ref.responseLens} {
			for _, q := range []float64{0.5, 0.9, 0.99} {
				fractional = fractional || sqlQuantile(lens, q) != math.Trunc(sqlQuantile(lens, q))
			}
		}
		if !fractional {
			t.Fatal("every token-length quantile falls on a rank: the data does not tell quantile definitions apart")
		}
		rows := run("--report", "token-lengths")
		c.count(rows, 2)
		for i, x := range []struct {
			name string
			lens []float64
		}{{"prompt", ref.promptLens}, {"response", ref.responseLens}} {
			c.str(rows[i], "tokens", x.name)
			c.num(rows[i], "steps", len(x.lens))
			c.num(rows[i], "mean", sqlMean(x.lens))
			c.num(rows[i], "p50", sqlQuantile(x.lens, 0.5))
			c.num(rows[i], "p90", sqlQuantile(x.lens, 0.9))
			c.num(rows[i], "p99", sqlQuantile(x.lens, 0.99))
			c.num(rows[i], "min", slicesMin(x.lens))
			c.num(rows[i], "max", slicesMax(x.lens))
		}
	}

	// advantage, over trajectories, per estimator
	{
		c := &sqlCheck{t: t, what: "advantage"}
		by := map[string][]float64{}
		for _, tr := range ref.trajs {
			by[tr.estimator] = append(by[tr.estimator], tr.advantage)
		}
		var ests []string
		for e := range by {
			ests = append(ests, e)
		}
		sort.Strings(ests)
		if len(ests) != 2 {
			t.Fatalf("estimators %v, want the two of the two runs", ests)
		}
		rows := run("--report", "advantage")
		c.count(rows, len(ests))
		for i, e := range ests {
			xs := by[e]
			zeros := 0
			for _, x := range xs {
				if x == 0 {
					zeros++
				}
			}
			if zeros == 0 || zeros == len(xs) {
				t.Fatalf("%s: %d of %d advantages are zero: zero_fraction is not exercised", e, zeros, len(xs))
			}
			c.str(rows[i], "estimator", e)
			c.num(rows[i], "trajectories", len(xs))
			c.num(rows[i], "mean", sqlMean(xs))
			c.num(rows[i], "std", sqlStdPop(xs))
			c.num(rows[i], "min", slicesMin(xs))
			c.num(rows[i], "p01", sqlQuantile(xs, 0.01))
			c.num(rows[i], "p50", sqlQuantile(xs, 0.5))
			c.num(rows[i], "p99", sqlQuantile(xs, 0.99))
			c.num(rows[i], "max", slicesMax(xs))
			c.num(rows[i], "zero_fraction", float64(zeros)/float64(len(xs)))
		}
	}

	// dead-letters
	{
		c := &sqlCheck{t: t, what: "dead-letters"}
		var reasons []string
		for r := range ref.deadLetters {
			reasons = append(reasons, r)
		}
		sort.Slice(reasons, func(i, j int) bool {
			a, b := ref.deadLetters[reasons[i]], ref.deadLetters[reasons[j]]
			return a > b || a == b && reasons[i] < reasons[j]
		})
		rows := run("--report", "dead-letters")
		c.count(rows, len(reasons))
		for i, r := range reasons {
			c.str(rows[i], "reason", r)
			c.num(rows[i], "dead_letters", ref.deadLetters[r])
			c.num(rows[i], "share", float64(ref.deadLetters[r])/float64(ref.deadLetterLines))
		}
	}

	// The trajectories view, row by row.
	{
		c := &sqlCheck{t: t, what: "trajectories view"}
		rows := run("SELECT * FROM trajectories ORDER BY group_id, group_version, trajectory_id")
		c.count(rows, len(ref.trajs))
		for _, row := range rows {
			k := sqlKey(row["group_id"], "|", row["group_version"], "|", row["trajectory_id"])
			tr := ref.trajs[k]
			if tr == nil {
				c.fail("unexpected trajectory %s", k)
				continue
			}
			c.str(row, "task_id", tr.task)
			c.str(row, "role", tr.role)
			c.num(row, "reward", tr.reward)
			c.num(row, "num_steps", tr.numSteps)
			c.num(row, "steps", tr.steps)
			c.num(row, "prompt_tokens", tr.promptTokens)
			c.num(row, "response_tokens", tr.responseTokens)
			c.num(row, "min_policy_version", tr.minPV)
			c.num(row, "max_policy_version", tr.maxPV)
			if tr.isCorrect == nil {
				c.str(row, "is_correct", nil)
			} else {
				c.str(row, "is_correct", *tr.isCorrect)
			}
			c.str(row, "termination_reason", tr.termination)
			c.str(row, "partial", tr.partial)
			c.str(row, "filter_reason", tr.filter)
			c.num(row, "advantage", tr.advantage)
			c.str(row, "estimator", tr.estimator)
			c.num(row, "expected_group_size", tr.expected)
			c.str(row, "shard", tr.shard)
			c.str(row, "pass", tr.pass())
		}
	}

	// The groups view, row by row.
	{
		c := &sqlCheck{t: t, what: "groups view"}
		rows := run("SELECT * FROM groups")
		c.count(rows, len(groups))
		partial := 0
		for _, row := range rows {
			k := sqlKey(row["group_id"], "|", row["group_version"])
			g := groups[k]
			if g == nil {
				c.fail("unexpected group %s", k)
				continue
			}
			if g.partial {
				partial++
			}
			c.str(row, "task_id", g.task)
			c.num(row, "trajectories", g.trajectories)
			c.num(row, "steps", g.steps)
			c.num(row, "reward_mean", g.mean)
			c.num(row, "reward_std", g.std)
			c.num(row, "reward_min", g.min)
			c.num(row, "reward_max", g.max)
			c.num(row, "passes", g.passes)
			c.str(row, "partial", g.partial)
			c.num(row, "expected_group_size", g.expected)
			c.str(row, "shard", g.shard)
		}
		if partial == 0 {
			t.Fatal("no partial group in the data")
		}
	}

	// steps and shards agree with the manifest.
	{
		c := &sqlCheck{t: t, what: "steps and shards"}
		rows := run("SELECT (SELECT count(*) FROM steps) AS steps, (SELECT sum(\"rows\") FROM shards) AS manifest_rows, " +
			"(SELECT count(*) FROM shards) AS shards, (SELECT count(DISTINCT shard) FROM steps) AS shards_read, " +
			"(SELECT string_agg(path, ',' ORDER BY seq) FROM shards) AS paths")
		c.count(rows, 1)
		c.num(rows[0], "steps", ref.rows)
		c.num(rows[0], "manifest_rows", ref.rows)
		c.num(rows[0], "shards", len(ref.order))
		c.num(rows[0], "shards_read", len(ref.order))
		c.str(rows[0], "paths", strings.Join(ref.order, ","))
	}
}

// sqlSnapshot lists the files under root with sizes and times.
func sqlSnapshot(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %d %s %v\n", p, info.Size(), info.ModTime().Format(time.RFC3339Nano), info.Mode())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// ---------------------------------------------------------------------------
// Tests

// TestSQLReports: every named report and the views over a local output
// whose path needs quoting, against the independent computation; the
// output root is not modified.
func TestSQLReports(t *testing.T) {
	t.Parallel() // see main_test.go
	bin := e2eBinary(t)
	work := t.TempDir()
	files := sqlInputs(t, bin, work)
	out := filepath.Join(work, "out d'été")
	dead, written := sqlIngest(t, bin, work, out, nil, files)
	before := sqlSnapshot(t, out)

	ref := sqlLocalRef(t, out)
	if fmt.Sprint(ref.deadLetters) != fmt.Sprint(dead) {
		t.Fatalf("committed dead letters %v, but ingest reported %v", ref.deadLetters, dead)
	}
	for _, r := range []string{"incomplete_trajectory", "incomplete_group", "malformed_json", "wrong_type"} {
		if ref.deadLetters[r] == 0 {
			t.Fatalf("no %s dead letter in the data (%v)", r, ref.deadLetters)
		}
	}
	if g := int64(len(ref.groups())); g != written {
		t.Fatalf("the shards hold %d groups, ingest wrote %d", g, written)
	}
	if len(ref.order) < 6 {
		t.Fatalf("only %d shards", len(ref.order))
	}
	from := []string{"--from", e2eFileURL(out)}
	sqlCheckReports(t, bin, work, nil, from, ref)

	// The listing names the views, their columns and the reports.
	r := e2eRun(t, bin, work, append([]string{"sql"}, from...)...)
	if r.code != 0 {
		t.Fatalf("sql listing: exit %d\n%s", r.code, r.stderr)
	}
	for _, want := range []string{"steps:", "trajectories:", "groups:", "shards:", "dead_letters:", "prompt_ids", "reward_std",
		"reward-by-version", "pass-at-k", "staleness", "token-lengths", "advantage", "dead-letters"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("the listing lacks %q:\n%s", want, r.stdout)
		}
	}
	// A table for terminals, CSV with a header.
	r = e2eRun(t, bin, work, append([]string{"sql", "--report", "reward-by-version"}, from...)...)
	if r.code != 0 || !regexp.MustCompile(`(?m)^group_version +groups +trajectories +mean_reward +pass_rate\n-+ `).MatchString(r.stdout) {
		t.Errorf("table output (exit %d):\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = e2eRun(t, bin, work, append([]string{"sql", "--format", "csv", "SELECT count(*) AS n FROM dead_letters"}, from...)...)
	if want := fmt.Sprintf("n\n%d\n", ref.deadLetterLines); r.code != 0 || r.stdout != want {
		t.Errorf("csv output %q (exit %d, %s), want %q", r.stdout, r.code, r.stderr, want)
	}
	// Usage errors exit 2: a bad query, an unknown report, both a query
	// and a report, an unknown format.
	for _, args := range [][]string{
		{"SELECT nope FROM steps"}, {"--report", "nope"}, {"--report", "staleness", "SELECT 1"}, {"--format", "xml", "SELECT 1"},
		{"--report", "pass-at-k", "--k", "0"},
	} {
		if r := e2eRun(t, bin, work, append(append([]string{"sql"}, from...), args...)...); r.code != 2 {
			t.Errorf("sql %q: exit %d, want 2\n%s", args, r.code, r.stderr)
		}
	}

	// --views-sql statements run as they are in a fresh DuckDB, and the
	// report query after them.
	script, db := viewsScript(t, bin, work, append([]string{"--report", "dead-letters"}, from...)...)
	stmts := strings.Split(script, ";\n")
	last := strings.TrimSpace(stmts[len(stmts)-2])
	for _, s := range stmts[:len(stmts)-2] {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("pasting %s: %v", e2eClip(s, 300), err)
		}
	}
	var n int64
	if err := db.QueryRow("SELECT count(*) FROM steps").Scan(&n); err != nil || n != ref.rows {
		t.Errorf("pasted steps: %d rows (%v), want %d", n, err, ref.rows)
	}
	var reasons int
	rows, err := db.Query(last)
	if err != nil {
		t.Fatalf("pasted report: %v\n%s", err, last)
	}
	for rows.Next() {
		reasons++
	}
	rows.Close()
	if reasons != len(ref.deadLetters) {
		t.Errorf("pasted dead-letters report: %d reasons, want %d", reasons, len(ref.deadLetters))
	}

	if after := sqlSnapshot(t, out); after != before {
		t.Errorf("rllm-pipe sql modified the output root:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestSQLCommittedOnly: files the manifest does not list are invisible:
// a stray shard in a partition folder, one in a new partition folder, one
// being written under _tmp, and dead letters past the committed length.
func TestSQLCommittedOnly(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	files := sqlInputs(t, bin, work)
	out := filepath.Join(work, "out")
	sqlIngest(t, bin, work, out, nil, files[:1])
	ref := sqlLocalRef(t, out)
	from := []string{"--from", out}
	count := func(q string) int64 {
		t.Helper()
		rows := sqlRows(t, bin, work, nil, append(from, q)...)
		if len(rows) != 1 {
			t.Fatalf("%s: %v", q, rows)
		}
		n, err := rows[0]["n"].(json.Number).Int64()
		if err != nil {
			t.Fatalf("%s: %v", q, rows)
		}
		return n
	}
	const stepsQ, shardsQ, dlqQ = "SELECT count(*) AS n FROM steps", "SELECT count(DISTINCT shard) AS n FROM steps", "SELECT count(*) AS n FROM dead_letters"
	if n := count(stepsQ); n != ref.rows {
		t.Fatalf("steps: %d rows, want %d", n, ref.rows)
	}

	shard, err := os.ReadFile(filepath.Join(out, filepath.FromSlash(ref.order[0])))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(filepath.Join(out, filepath.FromSlash(ref.order[0])))
	for _, p := range []string{
		filepath.Join(dir, "part-orphan-000001.parquet"),
		filepath.Join(out, "policy=99", "part-orphan-000002.parquet"),
		filepath.Join(out, "_tmp", "policy=0_part-x.parquet.tmp"),
		filepath.Join(out, "stray.parquet"),
	} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, shard, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dlqs, err := filepath.Glob(filepath.Join(out, "_dlq", "*.jsonl"))
	if err != nil || len(dlqs) != 1 {
		t.Fatalf("dead-letter files %v (%v)", dlqs, err)
	}
	f, err := os.OpenFile(dlqs[0], os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// A whole uncommitted line and a torn one.
	if _, err := f.WriteString(`{"reason":"late","error":"late: x","source":{"file":"in","line":1},"record":"{}"}` + "\n" + `{"reason":"la`); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.WriteFile(filepath.Join(out, "_dlq", "other-run.jsonl"), []byte(`{"reason":"late","error":"x","source":{},"record":""}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	if n := count(stepsQ); n != ref.rows {
		t.Errorf("with orphan shards, steps: %d rows, want %d", n, ref.rows)
	}
	if n := count(shardsQ); n != int64(len(ref.order)) {
		t.Errorf("steps come from %d shards, want %d", n, len(ref.order))
	}
	if n := count("SELECT count(*) AS n FROM steps WHERE shard NOT IN (SELECT path FROM shards) OR shard LIKE '%orphan%'"); n != 0 {
		t.Errorf("%d rows from files the manifest does not list", n)
	}
	if n := count(dlqQ); n != int64(ref.deadLetterLines) {
		t.Errorf("with an uncommitted tail, dead_letters: %d rows, want %d", n, ref.deadLetterLines)
	}
	if n := count("SELECT count(*) AS n FROM dead_letters WHERE reason = 'late'"); n != ref.deadLetters["late"] {
		t.Errorf("late dead letters: %d, want %d", n, ref.deadLetters["late"])
	}
}

// sqlHostileTasks rewrites, in file, the task_id of every record of the
// tasks ≡ 2 (mod 4) to carry a terminal escape (clear screen, set the
// window title), a carriage return and a right-to-left override, as a
// hostile rollout worker could; it returns the suffix.
func sqlHostileTasks(t *testing.T, file string) string {
	t.Helper()
	const suffix = "\x1b[2J\x1b]0;pwned\a\r\u202e"
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var lines [][]byte
	for _, l := range e2eSplitLines(data) {
		var rec map[string]any
		if json.Unmarshal(l, &rec) == nil && genTaskRE.Match(l) && genTask(t, l)%4 == 2 {
			rec["task_id"] = rec["task_id"].(string) + suffix
			if l, err = json.Marshal(rec); err != nil {
				t.Fatal(err)
			}
		}
		lines = append(lines, l)
	}
	if err := os.WriteFile(file, e2eJoinLines(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	return suffix
}

// TestSQLReadOnly: a query reaches nothing but the committed data: every
// attempt to read a host file, write (over the manifest, a shard, or
// anywhere), attach, install, load, or undo the settings exits 2 and
// changes nothing, while the views and every report still run; table
// output escapes the terminal escapes a record carried; and
// --allow-host-files lifts the limits.
func TestSQLReadOnly(t *testing.T) {
	t.Parallel() // see main_test.go
	bin := e2eBinary(t)
	work := t.TempDir()
	files := sqlInputs(t, bin, work)
	suffix := sqlHostileTasks(t, files[0])
	out := filepath.Join(work, "out")
	sqlIngest(t, bin, work, out, nil, files[:1])
	ref := sqlLocalRef(t, out)
	manifest := filepath.Join(out, "_manifest", "shards.jsonl")
	shard := filepath.Join(out, filepath.FromSlash(ref.order[0]))
	secret := filepath.Join(work, "secret.csv")
	if err := os.WriteFile(secret, []byte("word\nhostsecret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	written := filepath.Join(work, "written")
	q := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	before := sqlSnapshot(t, out)

	// Every escape is refused in connectors/duckdb (TestSandboxRefusesEscapes,
	// TestSandboxRefusesEveryStateFunction); here, that a refusal is exit
	// 2 and changes nothing, for a read and for writes.
	for _, query := range []string{
		"SELECT * FROM read_csv(" + q(secret) + ")",
		"COPY (SELECT 'x' AS x) TO " + q(manifest) + " (FORMAT csv, HEADER false)",
		"COPY (SELECT * FROM steps LIMIT 1) TO " + q(shard) + " (FORMAT parquet, USE_TMP_FILE false)",
		"COPY (SELECT 1 AS x) TO " + q(written+".csv") + "; SELECT 1",
		"EXPORT DATABASE " + q(written),
		"ATTACH " + q(written+".db"),
		"COPY (SELECT * FROM steps) TO " + q(written+".parquet") + " (FORMAT parquet)",
	} {
		r := e2eRun(t, bin, work, "sql", "--from", out, query)
		if r.code != 2 || !strings.Contains(r.stderr, "refused") || strings.Contains(r.stdout+r.stderr, "hostsecret") {
			t.Errorf("sql %s: exit %d, want 2 and a refusal\n%s%s", e2eClip(query, 200), r.code, e2eClip(r.stdout, 500), r.stderr)
		}
	}
	for _, p := range []string{written, written + ".parquet", written + ".csv", written + ".db"} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s was written (%v)", p, err)
		}
	}
	if after := sqlSnapshot(t, out); after != before {
		t.Errorf("rllm-pipe sql modified the output root:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// The views and the reports still run (every report and view:
	// connectors/duckdb's sandbox tests).
	if r := e2eRun(t, bin, work, "sql", "--from", out, "--report", reportNames()[0]); r.code != 0 {
		t.Errorf("--report %s: exit %d\n%s", reportNames()[0], r.code, r.stderr)
	}
	for _, query := range []string{"SELECT count(*) AS n FROM steps", "EXPLAIN SELECT * FROM groups"} {
		if r := e2eRun(t, bin, work, "sql", "--from", out, "--format", "csv", query); r.code != 0 {
			t.Errorf("sql %s: exit %d\n%s", query, r.code, r.stderr)
		}
	}
	if r := e2eRun(t, bin, work, "sql", "--from", out); r.code != 0 || !strings.Contains(r.stdout, "trajectories:") {
		t.Errorf("listing: exit %d\n%s", r.code, r.stderr)
	}

	// Table output escapes what the records carried; jsonl reads back
	// exactly.
	hostileQ := "SELECT DISTINCT task_id FROM trajectories WHERE contains(task_id, chr(27)) ORDER BY task_id LIMIT 3"
	r := e2eRun(t, bin, work, "sql", "--from", out, hostileQ)
	if r.code != 0 || !strings.Contains(r.stdout, `\x1b[2J\x1b]0;pwned\x07\r\u202e`) || strings.ContainsAny(r.stdout, "\x1b\a\r\u202e") {
		t.Errorf("table output of hostile task ids (exit %d):\n%q\n%s", r.code, r.stdout, r.stderr)
	}
	rows := sqlRows(t, bin, work, nil, "--from", out, hostileQ)
	if len(rows) == 0 {
		t.Fatal("no hostile task id in the trajectories")
	}
	for _, row := range rows {
		if id, _ := row["task_id"].(string); !strings.HasSuffix(id, suffix) {
			t.Errorf("jsonl task_id %q, want the suffix %q", id, suffix)
		}
	}

	// --allow-host-files lifts the sandbox.
	r = e2eRun(t, bin, work, "sql", "--from", out, "--allow-host-files", "--format", "csv",
		"SELECT word FROM read_csv("+q(secret)+") CROSS JOIN (SELECT count(*) FROM steps)")
	if r.code != 0 || r.stdout != "word\nhostsecret\n" {
		t.Errorf("--allow-host-files: exit %d\n%q\n%s", r.code, r.stdout, r.stderr)
	}
}

// TestIntegrationSQLS3: the reports over an S3 output, against the
// independent computation over the committed objects; the local copies
// are removed on exit.
func TestIntegrationSQLS3(t *testing.T) {
	t.Parallel() // see main_test.go
	target := newS3Target(t, "sql")
	bin := e2eBinary(t)
	work := t.TempDir()
	to, ep := target.url, target.flags()
	files := sqlInputs(t, bin, work)
	dead, _ := sqlIngest(t, bin, work, to, nil, files, ep...)

	// The reference: the committed objects, downloaded here.
	ctx := context.Background()
	st := target.open(t, "sql-test")
	cli, bucket := st.Client()
	var shards []sqlShard
	type dl struct {
		file  string
		bytes int64
	}
	var dls []dl
	for _, e := range mustEntries(t, st) {
		if e.DeadLetters != nil {
			dls = append(dls, dl{e.DeadLetters.File, e.DeadLetters.Bytes})
		}
		if e.Path == "" {
			continue
		}
		p := filepath.Join(work, "ref", filepath.FromSlash(e.Path))
		if err := cli.FGetObject(ctx, bucket, st.Key(e.Path), p, minio.GetObjectOptions{}); err != nil {
			t.Fatal(err)
		}
		shards = append(shards, sqlShard{e.Path, p, e.Seq})
	}
	ref := sqlReadShards(t, shards)
	seen := map[string]bool{}
	for _, d := range dls {
		if seen[d.file] {
			continue
		}
		seen[d.file] = true
		obj, err := cli.GetObject(ctx, bucket, st.Key(d.file), minio.GetObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(obj)
		obj.Close()
		if err != nil {
			t.Fatal(err)
		}
		ref.addDeadLetters(t, data[:d.bytes])
	}
	if fmt.Sprint(ref.deadLetters) != fmt.Sprint(dead) {
		t.Fatalf("committed dead letters %v, but ingest reported %v", ref.deadLetters, dead)
	}

	// An orphan object under the prefix (uploaded, never listed) must not
	// show.
	data, err := os.ReadFile(shards[0].file)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.PutObject(ctx, bucket, st.Key("policy=0/part-orphan-000001.parquet"), bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}

	tmp := filepath.Join(work, "tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	env := append(serviceEnv(), "TMPDIR="+tmp)
	sqlCheckReports(t, bin, work, env, append([]string{"--from", to}, ep...), ref)
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("sql left %d entries in TMPDIR (%s, ...)", len(left), left[0].Name())
	}
	// --views-sql needs somewhere to keep the copies.
	if r := sqlRun(t, bin, work, env, "sql", "--from", to, "--s3-endpoint", target.endpoint, "--views-sql"); r.code != 2 {
		t.Errorf("--views-sql over S3 without --download-dir: exit %d, want 2\n%s", r.code, r.stderr)
	}
	keep := filepath.Join(work, "keep")
	r := sqlRun(t, bin, work, env, "sql", "--from", to, "--s3-endpoint", target.endpoint, "--views-sql", "--download-dir", keep)
	if r.code != 0 || !strings.Contains(r.stdout, keep) {
		t.Errorf("--views-sql --download-dir: exit %d\n%s%s", r.code, e2eClip(r.stdout, 2000), r.stderr)
	}
	// The sandbox holds over the downloaded copies too: queries run, a
	// write over a copy or a read beside them is refused. (Each run
	// downloads the copies again: compare their contents.)
	copyOf := filepath.Join(keep, "shards", filepath.FromSlash(shards[0].path))
	contents := func() string {
		t.Helper()
		var b strings.Builder
		err := filepath.Walk(keep, func(p string, info os.FileInfo, err error) error {
			if err != nil || info.IsDir() {
				return err
			}
			data, err := os.ReadFile(p)
			fmt.Fprintf(&b, "%s %x\n", p, sha256.Sum256(data))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	before := contents()
	r = sqlRun(t, bin, work, env, "sql", "--from", to, "--s3-endpoint", target.endpoint, "--download-dir", keep, "--format", "csv", "SELECT count(*) AS n FROM steps")
	if want := fmt.Sprintf("n\n%d\n", ref.rows); r.code != 0 || r.stdout != want {
		t.Errorf("steps over S3 with --download-dir: exit %d, %q, want %q\n%s", r.code, r.stdout, want, r.stderr)
	}
	for _, q := range []string{
		"COPY (SELECT * FROM steps LIMIT 1) TO '" + copyOf + "' (FORMAT parquet, USE_TMP_FILE false)",
		"SELECT * FROM glob('" + keep + "/**')",
		"SELECT count(*) FROM read_parquet('s3://" + bucket + "/" + st.Key(shards[0].path) + "')",
	} {
		r := sqlRun(t, bin, work, env, "sql", "--from", to, "--s3-endpoint", target.endpoint, "--download-dir", keep, q)
		if r.code != 2 || !strings.Contains(r.stderr, "refused") {
			t.Errorf("sql %s over S3: exit %d, want 2 and a refusal\n%s", q, r.code, r.stderr)
		}
	}
	if after := contents(); after != before {
		t.Errorf("the downloaded copies changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestSQLErrorsEscapeControls: a DuckDB error quoting a stored value (a
// record id with ESC and BEL that would set the terminal's title) reaches
// stderr escaped, as table output does.
func TestSQLErrorsEscapeControls(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	hostile := `\u001b]0;pwned\u0007\u009b\u202e`
	data := `{"type":"step","step_id":"s0","task_id":"` + hostile + `","trajectory_id":"t0","step_index":0,"policy_version":0,"prompt_ids":[1],"response_ids":[2],"response_logprobs":[-1]}
{"type":"trajectory","trajectory_id":"t0","task_id":"` + hostile + `","reward":1,"num_steps":1,"group_size":1}
`
	if err := os.WriteFile(in, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	if code := run(context.Background(), []string{"ingest", "--from", in, "--to", out, "--quiet"}, io.Discard, io.Discard); code != 0 {
		t.Fatalf("ingest: exit %d", code)
	}
	for _, q := range []string{"SELECT CAST(task_id AS INT) FROM trajectories", "SELECT error(task_id) FROM steps"} {
		var stderr bytes.Buffer
		code := run(context.Background(), []string{"sql", "--from", out, q}, io.Discard, &stderr)
		if code == 0 {
			t.Fatalf("%s: exit 0", q)
		}
		for _, bad := range []string{"\x1b", "\x07", "\u009b", "\u202e"} {
			if strings.Contains(stderr.String(), bad) {
				t.Errorf("%s: stderr holds a raw %q: %q", q, bad, stderr.String())
			}
		}
		if !strings.Contains(stderr.String(), `\x1b]0;pwned\x07`) {
			t.Errorf("%s: the id is not shown escaped: %q", q, stderr.String())
		}
	}
}

// TestPrintWarningsEscapes: a warning from opening the views (which can
// quote a file name or a record) reaches the terminal escaped, for sql
// and report alike.
func TestPrintWarningsEscapes(t *testing.T) {
	var b strings.Builder
	printWarnings(&b, "report", []string{"shard \x1b]0;pwned\x07 is missing"})
	if got := b.String(); strings.ContainsAny(got, "\x1b\a") || !strings.HasPrefix(got, "rllm-pipe report: warning: shard ") {
		t.Errorf("printed %q", got)
	}
}
