package main

// The multi-turn comparison of issue 16 (--shape agents, agents-100,
// agents-text, or several comma-separated). For each shape it generates
// the agent trajectories once as whole records and once, from the same
// seed and group count, as wire deltas (gen --wire-deltas: the same trajectories,
// each call naming its parent and sending only the new tokens), then runs
// --pairs rounds of four child processes, their order rotated each round:
//
//	full    rllm-pipe ingest --full-prompts   whole records in, every prompt stored whole (the layout before issue 16)
//	deltas  rllm-pipe ingest                  whole records in, prefix deltas stored (the default)
//	wire    rllm-pipe ingest                  wire deltas in
//	duckdb  ingestbench duckdb                the same whole records, DuckDB's query and Parquet
//
// After each round (untimed) the outputs are checked: full and deltas
// against DuckDB's (a sample of step_ids, whole prompts and messages
// compared), wire against deltas. Then it counts the distinct tokens
// (each call's prompt tokens not reused from its predecessor's prompt and
// response, plus its response), and times reading every step's full
// prompt back, alternating the full and delta layouts --reads times:
// through `rllm-pipe sql` (the steps view), and with --python through the
// Python client against `rllm-pipe serve`.
//
// It prints per layout the ingest wall time, peak RSS, stored bytes and
// bytes per distinct token, the size ratios, the wire/whole ingest ratio
// on the same trajectories, the read-back times, and issue 16's aims,
// each met or not met; with two shapes, whether peak RSS stays flat in
// the number of turns.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/rllm-pipe/rllm-pipe/cmd/internal/benchkit"
)

// turnsOf: the multi-turn shapes and their turns per trajectory.
var turnsOf = map[string]int{"agents": 30, "agents-100": 100, "agents-text": 30}

// multiTurn reports whether shape (one or several, comma-separated) is
// run as the multi-turn comparison.
func multiTurn(shape string) bool {
	for _, s := range strings.Split(shape, ",") {
		if _, ok := turnsOf[s]; !ok {
			return false
		}
	}
	return true
}

// groupSize is ingest's --group-size for a shape (gen's).
func groupSize(shape string) int {
	if sh, ok := shapes[shape]; ok && sh.groupSize > 0 {
		return sh.groupSize
	}
	return 8
}

// layouts of the comparison, in the order of the first round.
var layouts = []string{"full", "deltas", "wire", "duckdb"}

var layoutWhat = map[string]string{
	"full":   "whole records in, --full-prompts (the layout before issue 16)",
	"deltas": "whole records in, prefix deltas stored (default)",
	"wire":   "wire deltas in (parent_step_id + prompt_delta_ids)",
	"duckdb": "DuckDB, the same whole records",
}

type mtLayout struct {
	Name    string      `json:"name"`
	What    string      `json:"what"`
	Command []string    `json:"command"`
	Runs    []runResult `json:"runs"`
	Wall    float64     `json:"median_wall_seconds"`
	RSS     int64       `json:"peak_rss_bytes_median"`
	RSSMax  int64       `json:"peak_rss_bytes_max"`
	Bytes   int64       `json:"stored_bytes"`
	// BytesPerToken is stored bytes per distinct token.
	BytesPerToken float64   `json:"bytes_per_distinct_token"`
	SQLRead       []float64 `json:"sql_read_seconds,omitempty"`
	ClientRead    []float64 `json:"client_read_seconds,omitempty"`
}

type aimResult struct {
	Aim   string  `json:"aim"`
	Value float64 `json:"value"`
	Want  float64 `json:"want"`
	Met   bool    `json:"met"`
	Note  string  `json:"note,omitempty"`
}

type mtReport struct {
	Shape          string      `json:"shape"`
	Turns          int         `json:"turns"`
	Input          inputInfo   `json:"input"`
	Wire           inputInfo   `json:"wire_input"`
	Steps          int64       `json:"steps"`
	PromptTokens   int64       `json:"prompt_tokens"`
	DistinctTokens int64       `json:"distinct_tokens"`
	Layouts        []*mtLayout `json:"layouts"`
	// WholeOverWire is, per round, the deltas layout's ingest wall (whole
	// records in) over the wire layout's (the same trajectories as deltas).
	WholeOverWire []float64   `json:"whole_over_wire"`
	FullOverWire  []float64   `json:"full_over_wire"`
	Checks        []check     `json:"checks"`
	ChecksOK      bool        `json:"checks_ok"`
	Aims          []aimResult `json:"aims"`
	OtherCPU      []float64   `json:"other_cpu_cores"`
}

func (r *mtReport) layout(name string) *mtLayout {
	for _, l := range r.Layouts {
		if l.Name == name {
			return l
		}
	}
	return nil
}

func runMultiTurn(ctx context.Context, c config, self string, stdout io.Writer) error {
	if c.input != "" {
		return errors.New("--input: the multi-turn shapes generate their whole and wire-delta inputs from one seed")
	}
	if c.python != "" {
		p, err := exec.LookPath(c.python)
		if err != nil {
			return fmt.Errorf("--python: %w", err)
		}
		c.python = p
		if c.pythonPath, err = filepath.Abs(c.pythonPath); err != nil {
			return err
		}
	}
	host, _ := os.Hostname()
	var reps []*mtReport
	var errs []error
	for _, sh := range strings.Split(c.shape, ",") {
		cs := c
		cs.shape = sh
		rep, err := runMultiTurnShape(ctx, cs, self, stdout)
		if err != nil {
			return fmt.Errorf("--shape %s: %w", sh, err)
		}
		if !rep.ChecksOK {
			errs = append(errs, fmt.Errorf("--shape %s: outputs disagree", sh))
		}
		reps = append(reps, rep)
	}
	flat := memoryFlat(reps)
	fmt.Fprintln(stdout)
	for _, rep := range reps {
		printMultiTurn(stdout, rep)
	}
	printFlat(stdout, reps, flat)
	fmt.Fprintf(stdout, "\nmachine: %s, %d CPUs; timings on a shared machine are noisy: medians of %d rounds with their spread\n", host, runtime.NumCPU(), c.pairs)
	if c.jsonOut != "" {
		b, err := json.MarshalIndent(map[string]any{"time": time.Now().UTC(), "host": host, "shapes": reps, "memory_flat": flat}, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(c.jsonOut, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("--json: %w", err)
		}
	}
	return errors.Join(errs...)
}

func runMultiTurnShape(ctx context.Context, c config, self string, stdout io.Writer) (*mtReport, error) {
	in, err := prepareInput(ctx, c, stdout)
	if err != nil {
		return nil, err
	}
	if len(in.Gen) == 0 {
		return nil, fmt.Errorf("%s: the cached input's gen arguments are unknown (rerun with --regen)", in.Path)
	}
	wire, err := prepareWire(ctx, c, in, stdout)
	if err != nil {
		return nil, err
	}
	rep := &mtReport{Shape: c.shape, Turns: turnsOf[c.shape], Input: in, Wire: wire, ChecksOK: true}
	root := filepath.Join(c.work, "out-multiturn", c.shape)
	outs := map[string]string{}
	for _, n := range layouts {
		outs[n] = filepath.Join(root, n)
	}
	duckOut := filepath.Join(outs["duckdb"], "steps.parquet")
	ingest := func(from, to string, extra ...string) []string {
		args := []string{c.bin, "ingest", "--from", "file://" + from, "--to", "file://" + to,
			"--group-size", strconv.Itoa(groupSize(c.shape)), "--estimator", "grpo"}
		return append(append(args, extra...), c.ingestArgs...)
	}
	cmds := map[string][]string{
		"full":   ingest(in.Path, outs["full"], "--full-prompts"),
		"deltas": ingest(in.Path, outs["deltas"]),
		"wire":   ingest(wire.Path, outs["wire"]),
		"duckdb": {self, duckMode, "--plan", c.duckPlan, "--in", in.Path, "--out", duckOut},
	}
	for _, n := range layouts {
		rep.Layouts = append(rep.Layouts, &mtLayout{Name: n, What: layoutWhat[n], Command: cmds[n]})
		fmt.Fprintf(stdout, "%-7s %s\n", n+":", strings.Join(cmds[n], " "))
	}
	for i := 1; i <= c.pairs; i++ {
		fmt.Fprintf(stdout, "round %d/%d:", i, c.pairs)
		order := append(slices.Clone(layouts[(i-1)%len(layouts):]), layouts[:(i-1)%len(layouts)]...)
		runs := map[string]runResult{}
		files := map[string][]string{}
		for _, n := range order {
			if err := os.RemoveAll(outs[n]); err != nil {
				return nil, err
			}
			if err := os.MkdirAll(outs[n], 0o755); err != nil {
				return nil, err
			}
			logPath := filepath.Join(c.work, "logs", fmt.Sprintf("%s-%s-%d.log", c.shape, n, i))
			var childOut bytes.Buffer
			var so io.Writer
			if n == "duckdb" {
				so = &childOut
			}
			r, err := runChild(ctx, cmds[n], outs[n], logPath, so)
			if err != nil {
				return nil, fmt.Errorf("round %d: %s: %w", i, n, err)
			}
			if n == "duckdb" {
				var res duckResult
				if err := json.Unmarshal(childOut.Bytes(), &res); err != nil {
					return nil, fmt.Errorf("round %d: duckdb child output %q: %w", i, childOut.String(), err)
				}
				r.Rows, r.QuerySeconds = res.Rows, res.QuerySeconds
				st, err := os.Stat(duckOut)
				if err != nil {
					return nil, err
				}
				r.OutputBytes, r.OutputFiles = st.Size(), 1
			} else if files[n], err = rllmOutput(outs[n], &r); err != nil {
				return nil, fmt.Errorf("round %d: %s output: %w", i, n, err)
			}
			runs[n] = r
			rep.layout(n).Runs = append(rep.layout(n).Runs, r)
			fmt.Fprintf(stdout, "  %s %.2f s, %s", n, r.WallSeconds, mib(r.PeakRSS))
		}
		rep.WholeOverWire = append(rep.WholeOverWire, runs["deltas"].WallSeconds/runs["wire"].WallSeconds)
		rep.FullOverWire = append(rep.FullOverWire, runs["full"].WallSeconds/runs["wire"].WallSeconds)
		var other float64
		for _, r := range runs {
			other = max(other, r.OtherCPU)
		}
		rep.OtherCPU = append(rep.OtherCPU, other)
		// The checks, untimed: full and deltas against DuckDB, wire
		// against deltas.
		seed := uint64(i) + c.seed
		for _, ck := range []struct {
			name  string
			files []string
			other []string
		}{
			{"full/duckdb", files["full"], []string{"--duckdb-out", duckOut}},
			{"deltas/duckdb", files["deltas"], []string{"--duckdb-out", duckOut}},
			{"wire/deltas", files["wire"], []string{"--against-root", outs["deltas"]}},
		} {
			res, err := compareWithInChild(ctx, self, ck.files, ck.other, c.sample, seed)
			if err != nil {
				return nil, fmt.Errorf("round %d: check %s: %w", i, ck.name, err)
			}
			if !res.OK {
				rep.ChecksOK = false
				res.Problem = ck.name + ": " + res.Problem
				fmt.Fprintf(stdout, "  CHECK %s FAILED: %s", ck.name, res.Problem)
			}
			rep.Checks = append(rep.Checks, res)
		}
		fmt.Fprintln(stdout, "  checks", map[bool]string{true: "ok", false: "FAILED"}[rep.ChecksOK])
	}
	if err := countTokens(ctx, c, outs["deltas"], rep); err != nil {
		return nil, err
	}
	if err := timeReads(ctx, c, outs, rep, stdout); err != nil {
		return nil, err
	}
	for _, l := range rep.Layouts {
		var walls, rss []float64
		for _, r := range l.Runs {
			walls = append(walls, r.WallSeconds)
			rss = append(rss, float64(r.PeakRSS))
			l.RSSMax = max(l.RSSMax, r.PeakRSS)
		}
		l.Wall, l.RSS = benchkit.Median(walls), int64(benchkit.Median(rss))
		l.Bytes = l.Runs[len(l.Runs)-1].OutputBytes
		if rep.DistinctTokens > 0 {
			l.BytesPerToken = float64(l.Bytes) / float64(rep.DistinctTokens)
		}
	}
	full, deltas, duck := rep.layout("full"), rep.layout("deltas"), rep.layout("duckdb")
	aim := func(name string, v, want float64, note string) {
		rep.Aims = append(rep.Aims, aimResult{Aim: name, Value: v, Want: want, Met: v >= want, Note: note})
	}
	aim("shards >= 10x smaller than DuckDB's for the same records", ratio(duck.Bytes, deltas.Bytes), 10, "")
	aim("shards >= 2.5x smaller than the layout before issue 16 (--full-prompts)", ratio(full.Bytes, deltas.Bytes), 2.5, "")
	aim("ingest of wire deltas >= 5x faster than of the same trajectories sent whole", benchkit.Median(rep.WholeOverWire), 5,
		fmt.Sprintf("median of the rounds' ratios %s; against --full-prompts %.2fx", spreadF(rep.WholeOverWire), benchkit.Median(rep.FullOverWire)))
	if !c.keep {
		_ = os.RemoveAll(root)
	}
	return rep, nil
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return float64(a) / float64(b)
}

// prepareWire generates (or finds cached) the wire-delta twin of in: the
// same gen arguments, seed and group count, with --wire-deltas.
func prepareWire(ctx context.Context, c config, in inputInfo, stdout io.Writer) (inputInfo, error) {
	path := strings.TrimSuffix(in.Path, ".jsonl") + "-wire.jsonl"
	metaPath := strings.TrimSuffix(path, ".jsonl") + ".meta.json"
	genArgs := append(slices.Clone(in.Gen), "--wire-deltas")
	if !c.regen {
		var meta inputInfo
		if b, err := os.ReadFile(metaPath); err == nil && json.Unmarshal(b, &meta) == nil && slices.Equal(meta.Gen, genArgs) {
			if st, err := os.Stat(path); err == nil && st.Size() == meta.Bytes && meta.Bytes > 0 {
				meta.Path, meta.Cached = path, true
				fmt.Fprintf(stdout, "wire twin: %s (%s, cached; %s)\n", path, human(meta.Bytes), meta.Summary)
				return meta, nil
			}
		}
	}
	fmt.Fprintf(stdout, "generating the wire-delta twin: rllm-pipe %s --out %s\n", strings.Join(genArgs, " "), path)
	info, err := runGen(ctx, c.bin, genArgs, path, metaPath)
	if err != nil {
		return inputInfo{}, err
	}
	fmt.Fprintf(stdout, "wire twin: %s (%s; %s)\n", path, human(info.Bytes), info.Summary)
	return info, nil
}

// tokensSQL counts, over the delta layout's stored rows, the steps, the
// whole prompt tokens, and the distinct tokens: each call's prompt tokens
// not reused from its predecessor's prompt and response, plus its
// response tokens.
const tokensSQL = `SELECT count(*) AS steps,
  sum(CASE WHEN coalesce(prompt_prefix_len, 0) > 0 THEN prompt_prefix_len + len(prompt_delta_ids) ELSE len(prompt_ids) END) AS prompt_tokens,
  sum(CASE WHEN coalesce(prompt_prefix_len, 0) > 0 THEN len(prompt_delta_ids) ELSE len(prompt_ids) END + len(response_ids)) AS distinct_tokens
FROM stored_steps`

func countTokens(ctx context.Context, c config, root string, rep *mtReport) error {
	out, err := exec.CommandContext(ctx, c.bin, "sql", "--from", root, "--format", "jsonl", tokensSQL).Output()
	if err != nil {
		return fmt.Errorf("counting tokens: %w", err)
	}
	var row struct {
		Steps          int64 `json:"steps"`
		PromptTokens   int64 `json:"prompt_tokens"`
		DistinctTokens int64 `json:"distinct_tokens"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &row); err != nil {
		return fmt.Errorf("counting tokens: %q: %w", out, err)
	}
	rep.Steps, rep.PromptTokens, rep.DistinctTokens = row.Steps, row.PromptTokens, row.DistinctTokens
	return nil
}

// readSQL reads every step's full prompt and messages through the steps
// view; the hash makes DuckDB build every list.
const readSQL = `SELECT count(*) AS steps, sum(len(prompt_ids)) AS prompt_tokens, bit_xor(hash(prompt_ids)) AS h, sum(length(messages)) AS message_chars FROM steps`

// clientScript reads every batch through the Python client and prints
// its own time (interpreter start and imports excluded).
const clientScript = `import json, sys, time
import pyarrow.compute as pc
from rllm_pipe import Client
t = time.perf_counter()
rows = tokens = chars = 0
with Client(sys.argv[1], consumer="bench-%d" % time.time_ns()) as client:
    for b in client.batches():
        rec = b.record
        rows += rec.num_rows
        tokens += pc.sum(pc.list_value_length(rec.column("prompt_ids"))).as_py() or 0
        chars += pc.sum(pc.utf8_length(rec.column("messages"))).as_py() or 0
        b.ack()
print(json.dumps({"seconds": time.perf_counter() - t, "rows": rows, "prompt_tokens": tokens}))
`

// timeReads times reading the full prompts back from the full and delta
// layouts, alternating, --reads times each: through sql, and with
// --python through the client against serve.
func timeReads(ctx context.Context, c config, outs map[string]string, rep *mtReport, stdout io.Writer) error {
	names := []string{"full", "deltas"}
	fmt.Fprintf(stdout, "read-back (%d each, alternating):", c.reads)
	for i := 0; i < c.reads; i++ {
		for k := range names {
			n := names[(i+k)%len(names)]
			l := rep.layout(n)
			logPath := filepath.Join(c.work, "logs", fmt.Sprintf("%s-sql-%s-%d.log", c.shape, n, i+1))
			var so bytes.Buffer
			r, err := runChild(ctx, []string{c.bin, "sql", "--from", outs[n], "--format", "jsonl", readSQL}, c.work, logPath, &so)
			if err != nil {
				return fmt.Errorf("sql read of %s: %w", n, err)
			}
			var got struct {
				Steps        int64 `json:"steps"`
				PromptTokens int64 `json:"prompt_tokens"`
			}
			if err := json.Unmarshal(bytes.TrimSpace(so.Bytes()), &got); err != nil || got.Steps != rep.Steps || got.PromptTokens != rep.PromptTokens {
				return fmt.Errorf("sql read of %s: %q, want %d steps and %d prompt tokens (%v)", n, so.String(), rep.Steps, rep.PromptTokens, err)
			}
			l.SQLRead = append(l.SQLRead, r.WallSeconds)
			fmt.Fprintf(stdout, "  sql %s %.2f s", n, r.WallSeconds)
			if c.python == "" {
				continue
			}
			s, err := clientRead(ctx, c, outs[n], rep)
			if err != nil {
				return fmt.Errorf("client read of %s: %w", n, err)
			}
			l.ClientRead = append(l.ClientRead, s)
			fmt.Fprintf(stdout, "  client %s %.2f s", n, s)
		}
	}
	fmt.Fprintln(stdout)
	return nil
}

// clientRead starts serve on root, reads it all through the Python client
// and returns the client's read time.
func clientRead(ctx context.Context, c config, root string, rep *mtReport) (float64, error) {
	ready := filepath.Join(c.work, fmt.Sprintf("serve-ready-%d", time.Now().UnixNano()))
	defer os.Remove(ready)
	serve := exec.CommandContext(ctx, c.bin, "serve", "--from", root, "--listen", "127.0.0.1:0", "--ready-file", ready, "--follow=false", "--poll", "50ms",
		// A consumer group of its own: the group's acknowledgements live
		// in the store, and a second read in the same group gets nothing.
		"--consumer-group", fmt.Sprintf("bench-%d", time.Now().UnixNano()))
	var serr bytes.Buffer
	serve.Stderr = &serr
	if err := serve.Start(); err != nil {
		return 0, err
	}
	done := make(chan error, 1)
	go func() { done <- serve.Wait() }()
	defer func() {
		_ = serve.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = serve.Process.Kill()
			<-done
		}
	}()
	var addr string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if b, err := os.ReadFile(ready); err == nil && len(bytes.TrimSpace(b)) > 0 {
			addr = string(bytes.TrimSpace(b))
			break
		}
		select {
		case err := <-done:
			return 0, fmt.Errorf("serve exited: %v: %s", err, serr.String())
		default:
		}
		if time.Now().After(deadline) {
			return 0, errors.New("serve did not start in 60 s")
		}
	}
	py := exec.CommandContext(ctx, c.python, "-c", clientScript, "grpc://"+addr)
	py.Env = append(os.Environ(), "PYTHONPATH="+c.pythonPath)
	var out, perr bytes.Buffer
	py.Stdout, py.Stderr = &out, &perr
	if err := py.Run(); err != nil {
		return 0, fmt.Errorf("%w: %s", err, perr.String())
	}
	var got struct {
		Seconds      float64 `json:"seconds"`
		Rows         int64   `json:"rows"`
		PromptTokens int64   `json:"prompt_tokens"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(out.Bytes()), &got); err != nil {
		return 0, fmt.Errorf("client output %q: %w", out.String(), err)
	}
	if got.Rows != rep.Steps || got.PromptTokens != rep.PromptTokens {
		return 0, fmt.Errorf("the client read %d rows and %d prompt tokens, want %d and %d", got.Rows, got.PromptTokens, rep.Steps, rep.PromptTokens)
	}
	return got.Seconds, nil
}

// memoryFlat compares, for each rllm-pipe layout, the peak RSS at the
// most turns with that at the fewest (same input size): flat when within
// 1.25x for the layouts of issue 16 (deltas from whole records, wire
// deltas); --full-prompts is shown beside them.
func memoryFlat(reps []*mtReport) *aimResult {
	if len(reps) < 2 {
		return nil
	}
	lo, hi := reps[0], reps[0]
	for _, r := range reps {
		if r.Turns < lo.Turns {
			lo = r
		}
		if r.Turns > hi.Turns {
			hi = r
		}
	}
	if hi.Turns == lo.Turns {
		return nil
	}
	worst := 0.0
	var notes []string
	for _, n := range []string{"full", "deltas", "wire"} {
		q := ratio(hi.layout(n).RSSMax, lo.layout(n).RSSMax)
		if n != "full" {
			worst = max(worst, q)
		}
		notes = append(notes, fmt.Sprintf("%s %s -> %s (%.2fx)", n, mib(lo.layout(n).RSSMax), mib(hi.layout(n).RSSMax), q))
	}
	return &aimResult{Aim: fmt.Sprintf("memory flat in turns: peak RSS at %d turns within 1.25x of %d turns (deltas and wire; max RSS of the rounds)", hi.Turns, lo.Turns),
		Value: worst, Want: 1.25, Met: worst <= 1.25, Note: strings.Join(notes, "; ")}
}

func spreadF(xs []float64) string {
	if len(xs) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f–%.2f", slices.Min(xs), slices.Max(xs))
}

func printMultiTurn(w io.Writer, rep *mtReport) {
	fmt.Fprintf(w, "== %s: %d-turn agents ==\n", rep.Shape, rep.Turns)
	fmt.Fprintf(w, "input: %s (%s; %s)\nwire twin: %s (%s, %.1fx smaller)\n", rep.Input.Path, human(rep.Input.Bytes), rep.Input.Summary,
		rep.Wire.Path, human(rep.Wire.Bytes), ratio(rep.Input.Bytes, rep.Wire.Bytes))
	fmt.Fprintf(w, "steps %d; prompt tokens %d (whole); distinct tokens %d (each call's new prompt tokens plus its response): %.1fx\n",
		rep.Steps, rep.PromptTokens, rep.DistinctTokens, ratio(rep.PromptTokens, rep.DistinctTokens))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "layout\tingest wall\t(spread)\tpeak RSS\t(max)\tstored\tB/distinct token\tDuckDB/this\tfull/this\tsql read\tclient read\t")
	full, duck := rep.layout("full"), rep.layout("duckdb")
	for _, l := range rep.Layouts {
		var walls []float64
		for _, r := range l.Runs {
			walls = append(walls, r.WallSeconds)
		}
		read := func(xs []float64) string {
			if len(xs) == 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f s (%s)", benchkit.Median(xs), spreadF(xs))
		}
		fmt.Fprintf(tw, "%s\t%.2f s\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t%.2f\t%s\t%s\t\n", l.Name, l.Wall, spreadF(walls), mib(l.RSS), mib(l.RSSMax),
			human(l.Bytes), l.BytesPerToken, ratio(duck.Bytes, l.Bytes), ratio(full.Bytes, l.Bytes), read(l.SQLRead), read(l.ClientRead))
	}
	tw.Flush()
	for _, l := range rep.Layouts {
		fmt.Fprintf(w, "  %s: %s\n", l.Name, l.What)
	}
	fmt.Fprintf(w, "ingest wall, whole records in (deltas) / wire deltas in, same trajectories: %.2fx (rounds %s); --full-prompts / wire: %.2fx (rounds %s)\n",
		benchkit.Median(rep.WholeOverWire), spreadF(rep.WholeOverWire), benchkit.Median(rep.FullOverWire), spreadF(rep.FullOverWire))
	var other []string
	for _, o := range rep.OtherCPU {
		other = append(other, fmt.Sprintf("%.2f", o))
	}
	fmt.Fprintf(w, "other work on the machine, most during a round's runs, in cores: %s\n", strings.Join(other, " "))
	fmt.Fprintf(w, "checks: %s\n", map[bool]string{true: "ok (full and deltas against DuckDB, wire against deltas; sampled step_ids, whole prompts and messages)", false: "FAILED"}[rep.ChecksOK])
	for _, ck := range rep.Checks {
		if !ck.OK {
			fmt.Fprintf(w, "  %s\n", ck.Problem)
		}
	}
	fmt.Fprintln(w, "aims (issue 16):")
	for _, a := range rep.Aims {
		printAim(w, a)
	}
	fmt.Fprintln(w)
}

func printAim(w io.Writer, a aimResult) {
	met := "NOT MET"
	if a.Met {
		met = "met"
	}
	fmt.Fprintf(w, "  %s: %.2f (want %.2f): %s", a.Aim, a.Value, a.Want, met)
	if a.Note != "" {
		fmt.Fprintf(w, " — %s", a.Note)
	}
	fmt.Fprintln(w)
}

func printFlat(w io.Writer, reps []*mtReport, flat *aimResult) {
	if flat == nil {
		fmt.Fprintf(w, "memory flat in turns: not judged (one turns setting; run --shape agents,agents-100)\n")
		return
	}
	printAim(w, *flat)
}
