// Command ingestbench is a benchmark-only program (not shipped): it times
// `rllm-pipe ingest` side by side with DuckDB doing the same job on the
// same input, the yardstick of issue 7.
//
// The job: read a JSON-lines trace file in which Step and Trajectory
// records are mixed (told apart by "type"), join every step to its
// trajectory, compute GRPO advantages per group in rLLM's convention
// (advantage = (r - mean) / (population std + 1e-6) over the group's
// trajectory rewards, one reward per trajectory, broadcast to its steps)
// and write zstd Parquet with the step columns.
//
// The input is generated with `rllm-pipe gen` (8 rollouts per group, 1-4
// steps, ~512-token prompts, ~256-token responses, chat messages on) at
// about --size bytes and cached under --work, so reruns skip generation
// (--regen after a generator change); --input uses an existing file
// instead (complete groups, no duplicates or bad records, or the outputs
// will not agree).
//
// It then runs --pairs alternating pairs of child processes:
//
//	(a) rllm-pipe ingest --from file://IN --to file://OUT --group-size 8 --estimator grpo
//	(b) ingestbench duckdb --in IN --out OUT.parquet   (this program, DuckDB through duckdb-go)
//
// Each side runs as its own process, so each gets its own wall time, CPU
// time and peak RSS (the child's rusage ru_maxrss). DuckDB keeps its
// defaults: all cores, no memory limit, its own Parquet settings; its
// query reads the file once into a materialised table that both the group
// statistics and the output read (faster than --duckdb-plan two-scans, a
// narrow scan for the groups and then a streaming scan of the steps
// through the joins, at the same peak RSS: the faster shape is the
// yardstick; docs/performance.md#ingest-against-duckdb). After every pair the two outputs are checked
// against each other (row counts, and trajectory, reward, advantage,
// versions, token ids, logprobs and messages for a random sample of step_ids; advantages
// within 1e-9), so the comparison is honest.
//
// It prints a table of the pairs, the medians, the ratio DuckDB wall /
// rllm-pipe wall (the median of the pairs' ratios, and the ratio of the
// medians), rllm-pipe's peak RSS, and how much CPU other processes took
// during each run (from /proc/stat), since timings on a shared machine are
// noisy; --json writes the same numbers. It exits non-zero on errors (a
// failed run, outputs that disagree), never because of the ratio.
//
//	make bench-ingest SIZE=1GB PAIRS=3
//	go run ./cmd/ingestbench --bin bin/rllm-pipe --size 200MB --pairs 1 --json bench.json
//	go run ./cmd/ingestbench --pairs 1 --duckdb-profile                 # where DuckDB spends its time
//	go run ./cmd/ingestbench --pairs 1 --ingest-args "--cpuprofile /tmp/ingest.pprof"
package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/rllm-pipe/rllm-pipe/cmd/internal/benchkit"

	_ "github.com/duckdb/duckdb-go/v2" // the "duckdb" database/sql driver

	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb"
	"github.com/rllm-pipe/rllm-pipe/connectors/local"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch {
	case len(os.Args) > 1 && os.Args[1] == duckMode:
		// Hidden mode: the DuckDB side of a pair, run as a child process.
		err = duckChild(ctx, os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == checkMode:
		// Hidden mode: the check of a pair's outputs, run as a child.
		err = checkChild(ctx, os.Args[2:], os.Stdout)
	default:
		err = run(ctx, os.Args[1:], os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ingestbench:", err)
		stop()
		os.Exit(1)
	}
}

// duckMode is the hidden first argument that runs the DuckDB side.
const duckMode = "duckdb"

// checkMode is the hidden first argument that compares a pair's outputs.
// The comparison runs in a child so that this process stays small: Go
// starts children with vfork, so a child's ru_maxrss starts at its
// parent's high-water mark, and a parent that had queried the outputs
// with DuckDB in-process (hundreds of MiB) would be reported as the peak
// RSS of every rllm-pipe run after it.
const checkMode = "check"

// shape is a trace shape of the benchmark: `rllm-pipe gen` flags without
// --groups, --seed and --out, and how many groups are generated once to
// learn the bytes per group.
type shape struct {
	args        []string
	calibration int
	groupSize   int // ingest's --group-size: gen's
}

// shapes: "steps" is the benchmark's shape since issue 7 (1-4 calls per
// trajectory); "agents" is 30-turn agents (issue 16): a ~1,200-token
// first prompt, ~150-token actions, ~400-token observations with a heavy
// tail, a few context resets and parallel tool calls, every prompt the
// whole conversation so far.
var shapes = map[string]shape{
	"steps": {[]string{"--group-size", "8", "--min-steps", "1", "--max-steps", "4", "--prompt-len", "512", "--response-len", "256"}, 256, 8},
	// The same steps without chat messages: issue 7's shape (token ids,
	// logprobs and scalars only), a second yardstick of issue 19.
	"steps-nomsg": {[]string{"--group-size", "8", "--min-steps", "1", "--max-steps", "4", "--prompt-len", "512", "--response-len", "256", "--messages=false"}, 256, 8},
	"agents":      {[]string{"--group-size", "8", "--turns", "30", "--prompt-len", "1200", "--response-len", "150", "--observation-len", "400", "--resets", "0.02", "--parallel-tools", "0.1"}, 4, 8},
	// The same agents with prompt deltas on the wire (gen --wire-deltas):
	// DuckDB then stores the records as sent, deltas and all.
	"agents-wire": {[]string{"--group-size", "8", "--turns", "30", "--prompt-len", "1200", "--response-len", "150", "--observation-len", "400", "--resets", "0.02", "--parallel-tools", "0.1", "--wire-deltas"}, 4, 8},
	// 100-turn agents (groups of 4, shorter observations), whole and with
	// deltas on the wire.
	"agents-100":      {[]string{"--group-size", "4", "--turns", "100", "--prompt-len", "1200", "--response-len", "150", "--observation-len", "200", "--resets", "0.01", "--parallel-tools", "0.1"}, 1, 4},
	"agents-100-wire": {[]string{"--group-size", "4", "--turns", "100", "--prompt-len", "1200", "--response-len", "150", "--observation-len", "200", "--resets", "0.01", "--parallel-tools", "0.1", "--wire-deltas"}, 1, 4},
	// The 30-turn agents with token ids like a tokenizer's (gen --tokens
	// text): what compresses in real traces, and so what each layout
	// saves, differs from random ids.
	"agents-text":      {[]string{"--group-size", "8", "--turns", "30", "--prompt-len", "1200", "--response-len", "150", "--observation-len", "400", "--resets", "0.02", "--parallel-tools", "0.1", "--tokens", "text"}, 4, 8},
	"agents-text-wire": {[]string{"--group-size", "8", "--turns", "30", "--prompt-len", "1200", "--response-len", "150", "--observation-len", "400", "--resets", "0.02", "--parallel-tools", "0.1", "--tokens", "text", "--wire-deltas"}, 4, 8},
}

type config struct {
	bin         string
	input       string
	size        int64
	sizeText    string
	pairs       int
	work        string
	seed        uint64
	shape       string
	jsonOut     string
	ingestArgs  []string
	sample      int
	regen       bool
	keep        bool
	duckProfile bool
	duckPlan    string
	duckOpts    string
	python      string
	pythonPath  string
	reads       int
}

func parseFlags(args []string) (config, error) {
	var c config
	var ingestArgs string
	fs := flag.NewFlagSet("ingestbench", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: ingestbench [flags]\n\nTimes `rllm-pipe ingest` against DuckDB doing the same job (JSON lines in, GRPO, zstd Parquet out).\n\n")
		fs.PrintDefaults()
	}
	home, _ := os.UserHomeDir()
	fs.StringVar(&c.bin, "bin", "bin/rllm-pipe", "the rllm-pipe binary to time (build it first)")
	fs.StringVar(&c.input, "input", "", "use this JSON-lines trace file instead of generating one")
	fs.StringVar(&c.sizeText, "size", "1GB", "size of the generated input (B, KB, MB, GB or KiB, MiB, GiB)")
	fs.IntVar(&c.pairs, "pairs", 3, "alternating (rllm-pipe, DuckDB) pairs to run")
	fs.StringVar(&c.work, "work", filepath.Join(home, ".cache", "rllm-pipe", "bench"), "work folder: cached inputs, outputs, logs")
	fs.Uint64Var(&c.seed, "seed", 1, "generator seed")
	fs.StringVar(&c.shape, "shape", "steps", "trace shape: steps (1-4 calls per trajectory), steps-nomsg (the same without chat messages), agents (30-turn agents, long observations), agents-100 (100 turns), agents-text (30 turns, token ids like a tokenizer's), agents-wire, agents-100-wire, agents-text-wire; agents, agents-100 and agents-text (or several, comma-separated) run the multi-turn comparison (see multiturn.go)")
	fs.StringVar(&c.python, "python", "", "multi-turn shapes: a Python with the rllm_pipe client's packages (e.g. the venv of scripts/pytest.sh) to time reading full prompts through the client; none: not timed")
	fs.StringVar(&c.pythonPath, "python-path", "train/python", "PYTHONPATH of the client read-back (the folder holding rllm_pipe)")
	fs.IntVar(&c.reads, "reads", 3, "multi-turn shapes: alternating read-back runs per layout through sql (and the client)")
	fs.StringVar(&c.jsonOut, "json", "", "also write the numbers as JSON to this file")
	fs.StringVar(&ingestArgs, "ingest-args", "", "extra flags for rllm-pipe ingest, space-separated (e.g. \"--decoders 2 --cpuprofile /tmp/cpu.out\")")
	fs.IntVar(&c.sample, "sample", 2000, "step_ids sampled to compare the two outputs")
	fs.BoolVar(&c.regen, "regen", false, "generate the input again even if a cached one exists (after a generator change)")
	fs.BoolVar(&c.keep, "keep", false, "keep the last pair's outputs under the work folder")
	fs.BoolVar(&c.duckProfile, "duckdb-profile", false, "have DuckDB write a JSON query profile per run into the work folder and print its busiest operators")
	fs.StringVar(&c.duckPlan, "duckdb-plan", "one-scan", "shape of DuckDB's query: one-scan (read once, materialised) or two-scans (narrow scan for the groups, streaming scan for the steps)")
	fs.StringVar(&c.duckOpts, "duckdb-copy-options", "", "extra options of DuckDB's COPY, e.g. \"ROW_GROUP_SIZE 16384\" (default none: DuckDB's own settings, the yardstick)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if _, err := duckSQLPlan(c.duckPlan, "in", "out", c.duckOpts); err != nil {
		return c, fmt.Errorf("--duckdb-plan: %w", err)
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if c.size, err = benchkit.ParseSize(c.sizeText); err != nil {
		return c, fmt.Errorf("--size: %w", err)
	}
	if c.pairs < 1 {
		return c, errors.New("--pairs must be >= 1")
	}
	if c.reads < 1 {
		return c, errors.New("--reads must be >= 1")
	}
	if c.sample < 1 {
		return c, errors.New("--sample must be >= 1")
	}
	c.ingestArgs = strings.Fields(ingestArgs)
	return c, nil
}

// runResult is one timed child process.
type runResult struct {
	WallSeconds float64 `json:"wall_seconds"`
	UserSeconds float64 `json:"user_seconds"`
	SysSeconds  float64 `json:"sys_seconds"`
	// CPUUse is (user + sys) / wall: about the number of cores kept busy.
	CPUUse       float64 `json:"cpu_use"`
	PeakRSS      int64   `json:"peak_rss_bytes"`
	Rows         int64   `json:"rows"`
	OutputBytes  int64   `json:"output_bytes"`
	OutputFiles  int     `json:"output_files"`
	QuerySeconds float64 `json:"query_seconds,omitempty"` // DuckDB: the COPY statement alone
	// OtherCPU is the CPU the rest of the machine used during the run
	// (all cores' busy time from /proc/stat, steal included, minus the
	// child's), in cores: a measure of the noise. -1 where unknown.
	OtherCPU float64 `json:"other_cpu_cores"`
	Log      string  `json:"log"`
	Profile  string  `json:"profile,omitempty"`
}

// check is the comparison of one pair's outputs.
type check struct {
	RowsRLLM        int64   `json:"rows_rllm_pipe"`
	RowsDuckDB      int64   `json:"rows_duckdb"`
	Sampled         int64   `json:"sampled"`
	Matched         int64   `json:"matched"`
	MaxAdvantageErr float64 `json:"max_abs_advantage_diff"`
	MaxRewardErr    float64 `json:"max_abs_reward_diff"`
	OtherMismatches int64   `json:"other_mismatches"` // trajectory_id, policy and group versions, token ids, logprobs, messages
	OK              bool    `json:"ok"`
	Problem         string  `json:"problem,omitempty"`
}

type pair struct {
	RLLM   runResult `json:"rllm_pipe"`
	DuckDB runResult `json:"duckdb"`
	Ratio  float64   `json:"ratio_duckdb_over_rllm_pipe"`
	Check  check     `json:"check"`
}

type inputInfo struct {
	Path    string   `json:"path"`
	Bytes   int64    `json:"bytes"`
	Gen     []string `json:"gen_args,omitempty"`
	Summary string   `json:"gen_summary,omitempty"`
	Cached  bool     `json:"cached"`
}

type report struct {
	Time         time.Time `json:"time"`
	Shape        string    `json:"shape"`
	Host         string    `json:"host"`
	CPUs         int       `json:"cpus"`
	Input        inputInfo `json:"input"`
	IngestCmd    []string  `json:"rllm_pipe_command"`
	DuckDBSQL    string    `json:"duckdb_sql"`
	Pairs        []pair    `json:"pairs"`
	MedianRLLM   float64   `json:"median_wall_seconds_rllm_pipe"`
	MedianDuckDB float64   `json:"median_wall_seconds_duckdb"`
	// Ratio is the median over pairs of DuckDB wall / rllm-pipe wall;
	// RatioOfMedians divides the two medians.
	Ratio          float64 `json:"ratio"`
	RatioOfMedians float64 `json:"ratio_of_medians"`
	RSSMedianRLLM  int64   `json:"peak_rss_bytes_rllm_pipe_median"`
	RSSMaxRLLM     int64   `json:"peak_rss_bytes_rllm_pipe_max"`
	RSSMedianDuck  int64   `json:"peak_rss_bytes_duckdb_median"`
	ChecksOK       bool    `json:"checks_ok"`
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	c, err := parseFlags(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if c.work, err = filepath.Abs(c.work); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(c.work, "logs"), 0o755); err != nil {
		return err
	}
	if c.bin, err = filepath.Abs(c.bin); err != nil {
		return err
	}
	if _, err := os.Stat(c.bin); err != nil {
		return fmt.Errorf("rllm-pipe binary: %w (build it: go build -o bin/rllm-pipe ./cmd/rllm-pipe)", err)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("own executable: %w", err)
	}
	if multiTurn(c.shape) {
		return runMultiTurn(ctx, c, self, stdout)
	}
	in, err := prepareInput(ctx, c, stdout)
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	rep := report{Time: time.Now().UTC(), Shape: c.shape, Host: host, CPUs: runtime.NumCPU(), Input: in, ChecksOK: true}

	outRoot := filepath.Join(c.work, "out")
	rllmOut := filepath.Join(outRoot, "rllm-pipe")
	duckDir := filepath.Join(outRoot, "duckdb")
	duckOut := filepath.Join(duckDir, "steps.parquet")
	ingestCmd := append([]string{c.bin, "ingest", "--from", "file://" + in.Path, "--to", "file://" + rllmOut,
		"--group-size", strconv.Itoa(groupSize(c.shape)), "--estimator", "grpo"}, c.ingestArgs...)
	rep.IngestCmd = ingestCmd
	rep.DuckDBSQL, _ = duckSQLPlan(c.duckPlan, in.Path, duckOut, c.duckOpts)
	fmt.Fprintf(stdout, "rllm-pipe: %s\nduckdb:    %s %s --plan %s --in %s --out %s", strings.Join(ingestCmd, " "), self, duckMode, c.duckPlan, in.Path, duckOut)
	if c.duckOpts != "" {
		fmt.Fprintf(stdout, " --copy-options %q", c.duckOpts)
	}
	fmt.Fprint(stdout, "\n\n")

	var checkErrs []error
	for i := 1; i <= c.pairs; i++ {
		var p pair
		// (a) rllm-pipe. A second run over the same output would skip the
		// committed groups, so the output starts empty every time.
		if err := os.RemoveAll(outRoot); err != nil {
			return err
		}
		logPath := filepath.Join(c.work, "logs", fmt.Sprintf("rllm-pipe-%d.log", i))
		fmt.Fprintf(stdout, "pair %d/%d: rllm-pipe ingest ... ", i, c.pairs)
		p.RLLM, err = runChild(ctx, ingestCmd, c.work, logPath, nil)
		if err != nil {
			return fmt.Errorf("pair %d: rllm-pipe: %w", i, err)
		}
		files, err := rllmOutput(rllmOut, &p.RLLM)
		if err != nil {
			return fmt.Errorf("pair %d: rllm-pipe output: %w", i, err)
		}
		fmt.Fprintf(stdout, "%.2f s, %s;  duckdb ... ", p.RLLM.WallSeconds, mib(p.RLLM.PeakRSS))

		// (b) DuckDB, in a child of its own; its spill folder (.tmp) is
		// its working directory.
		if err := os.MkdirAll(duckDir, 0o755); err != nil {
			return err
		}
		duckArgs := []string{self, duckMode, "--plan", c.duckPlan, "--in", in.Path, "--out", duckOut}
		if c.duckOpts != "" {
			duckArgs = append(duckArgs, "--copy-options", c.duckOpts)
		}
		if c.duckProfile {
			p.DuckDB.Profile = filepath.Join(c.work, "logs", fmt.Sprintf("duckdb-%d.profile.json", i))
			duckArgs = append(duckArgs, "--profile", p.DuckDB.Profile)
		}
		var childOut bytes.Buffer
		logPath = filepath.Join(c.work, "logs", fmt.Sprintf("duckdb-%d.log", i))
		prof := p.DuckDB.Profile
		p.DuckDB, err = runChild(ctx, duckArgs, duckDir, logPath, &childOut)
		if err != nil {
			return fmt.Errorf("pair %d: duckdb: %w", i, err)
		}
		p.DuckDB.Profile = prof
		var res duckResult
		if err := json.Unmarshal(childOut.Bytes(), &res); err != nil {
			return fmt.Errorf("pair %d: duckdb child output %q: %w", i, childOut.String(), err)
		}
		p.DuckDB.Rows, p.DuckDB.QuerySeconds = res.Rows, res.QuerySeconds
		if st, err := os.Stat(duckOut); err == nil {
			p.DuckDB.OutputBytes, p.DuckDB.OutputFiles = st.Size(), 1
		}
		p.Ratio = p.DuckDB.WallSeconds / p.RLLM.WallSeconds
		fmt.Fprintf(stdout, "%.2f s, %s;  ratio %.2f;  ", p.DuckDB.WallSeconds, mib(p.DuckDB.PeakRSS), p.Ratio)

		// The outputs must agree (outside the timed runs).
		p.Check, err = compareInChild(ctx, self, files, duckOut, c.sample, uint64(i)+c.seed)
		if err != nil {
			return fmt.Errorf("pair %d: comparing outputs: %w", i, err)
		}
		if p.Check.OK {
			fmt.Fprintf(stdout, "check ok\n")
		} else {
			fmt.Fprintf(stdout, "CHECK FAILED: %s\n", p.Check.Problem)
			rep.ChecksOK = false
			checkErrs = append(checkErrs, fmt.Errorf("pair %d: outputs disagree: %s", i, p.Check.Problem))
		}
		rep.Pairs = append(rep.Pairs, p)
	}
	if !c.keep {
		_ = os.RemoveAll(outRoot)
	}
	summarise(&rep)
	fmt.Fprintln(stdout)
	printReport(stdout, &rep)
	if c.duckProfile {
		for i, p := range rep.Pairs {
			if err := printProfile(stdout, i+1, p.DuckDB.Profile); err != nil {
				fmt.Fprintf(stdout, "duckdb profile %d: %v\n", i+1, err)
			}
		}
	}
	if c.jsonOut != "" {
		b, err := json.MarshalIndent(&rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(c.jsonOut, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("--json: %w", err)
		}
	}
	return errors.Join(checkErrs...)
}

// prepareInput returns the input file: --input, or a generated one cached
// under the work folder by size and seed.
func prepareInput(ctx context.Context, c config, stdout io.Writer) (inputInfo, error) {
	if c.input != "" {
		p, err := filepath.Abs(c.input)
		if err != nil {
			return inputInfo{}, err
		}
		st, err := os.Stat(p)
		if err != nil {
			return inputInfo{}, fmt.Errorf("--input: %w", err)
		}
		return inputInfo{Path: p, Bytes: st.Size()}, nil
	}
	sh, ok := shapes[c.shape]
	if !ok {
		return inputInfo{}, fmt.Errorf("--shape %q: want steps, steps-nomsg, agents, agents-100, agents-text or their -wire twins", c.shape)
	}
	name := fmt.Sprintf("traces-%d-seed%d", c.size, c.seed)
	if c.shape != "steps" {
		name = fmt.Sprintf("traces-%s-%d-seed%d", c.shape, c.size, c.seed)
	}
	path := filepath.Join(c.work, name+".jsonl")
	metaPath := filepath.Join(c.work, name+".meta.json")
	if !c.regen {
		var meta inputInfo
		if b, err := os.ReadFile(metaPath); err == nil && json.Unmarshal(b, &meta) == nil {
			if st, err := os.Stat(path); err == nil && st.Size() == meta.Bytes && meta.Bytes > 0 {
				meta.Path, meta.Cached = path, true
				fmt.Fprintf(stdout, "input: %s (%s, cached; %s)\n", path, human(meta.Bytes), meta.Summary)
				return meta, nil
			}
		}
	}

	// Calibrate: bytes per group of this shape and seed.
	base := append(slices.Clone(sh.args), "--seed", strconv.FormatUint(c.seed, 10))
	cal := exec.CommandContext(ctx, c.bin, append(append([]string{"gen"}, base...), "--groups", strconv.Itoa(sh.calibration), "--quiet", "--to", "-")...)
	var cw countWriter
	cal.Stdout = &cw
	var calErr bytes.Buffer
	cal.Stderr = &calErr
	if err := cal.Run(); err != nil {
		return inputInfo{}, fmt.Errorf("rllm-pipe gen (calibration): %w: %s", err, strings.TrimSpace(calErr.String()))
	}
	if cw.n == 0 {
		return inputInfo{}, errors.New("rllm-pipe gen wrote nothing")
	}
	groups := max(1, int(math.Round(float64(c.size)*float64(sh.calibration)/float64(cw.n))))

	genArgs := append(append([]string{"gen"}, base...), "--groups", strconv.Itoa(groups))
	fmt.Fprintf(stdout, "generating %s of traces: rllm-pipe %s --out %s\n", human(c.size), strings.Join(genArgs, " "), path)
	start := time.Now()
	info, err := runGen(ctx, c.bin, genArgs, path, metaPath)
	if err != nil {
		return inputInfo{}, err
	}
	fmt.Fprintf(stdout, "input: %s (%s in %.1f s; %s)\n", path, human(info.Bytes), time.Since(start).Seconds(), info.Summary)
	return info, nil
}

// runGen runs `bin gen genArgs` into path (through a temporary file, so
// an interrupted run leaves no input behind) and records what it made in
// metaPath, for the next run to reuse.
func runGen(ctx context.Context, bin string, genArgs []string, path, metaPath string) (inputInfo, error) {
	tmp := path + ".tmp"
	gen := exec.CommandContext(ctx, bin, append(slices.Clone(genArgs), "--to", tmp)...)
	var genErr bytes.Buffer
	gen.Stderr = &genErr
	if err := gen.Run(); err != nil {
		_ = os.Remove(tmp)
		return inputInfo{}, fmt.Errorf("rllm-pipe %s: %w: %s", strings.Join(genArgs, " "), err, strings.TrimSpace(genErr.String()))
	}
	st, err := os.Stat(tmp)
	if err != nil {
		return inputInfo{}, err
	}
	if err := os.Rename(tmp, path); err != nil {
		return inputInfo{}, err
	}
	info := inputInfo{Path: path, Bytes: st.Size(), Gen: genArgs, Summary: strings.TrimSpace(genErr.String())}
	b, _ := json.MarshalIndent(info, "", "  ")
	if err := os.WriteFile(metaPath, append(b, '\n'), 0o644); err != nil {
		return inputInfo{}, err
	}
	return info, nil
}

type countWriter struct{ n int64 }

func (w *countWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	return len(p), nil
}

// runChild runs argv in dir with stderr (and stdout, unless given) to
// logPath, and measures it.
func runChild(ctx context.Context, argv []string, dir, logPath string, stdout io.Writer) (runResult, error) {
	r := runResult{Log: logPath, OtherCPU: -1}
	lf, err := os.Create(logPath)
	if err != nil {
		return r, err
	}
	defer lf.Close()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Stderr = lf
	cmd.Stdout = lf
	if stdout != nil {
		cmd.Stdout = stdout
	}
	busy0, busyOK := benchkit.MachineBusy()
	start := time.Now()
	err = cmd.Run()
	wall := time.Since(start)
	busy1, busyOK1 := benchkit.MachineBusy()
	if err != nil {
		return r, fmt.Errorf("%w; last lines of %s:\n%s", err, logPath, tail(logPath, 20))
	}
	ps := cmd.ProcessState
	r.WallSeconds = wall.Seconds()
	r.UserSeconds = ps.UserTime().Seconds()
	r.SysSeconds = ps.SystemTime().Seconds()
	r.CPUUse = (r.UserSeconds + r.SysSeconds) / r.WallSeconds
	r.PeakRSS = benchkit.PeakRSS(ps)
	if busyOK && busyOK1 {
		r.OtherCPU = max(0, (busy1-busy0).Seconds()-r.UserSeconds-r.SysSeconds) / r.WallSeconds
	}
	return r, nil
}

// rllmOutput reads rllm-pipe's manifest: the committed shards, their rows
// and bytes.
func rllmOutput(root string, r *runResult) ([]string, error) {
	entries, err := local.ReadManifest(root)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range entries {
		if e.Path == "" {
			continue // a checkpoint without a shard
		}
		files = append(files, filepath.Join(root, filepath.FromSlash(e.Path)))
		r.Rows += e.Rows
		r.OutputBytes += e.Bytes
	}
	r.OutputFiles = len(files)
	if len(files) == 0 {
		return nil, errors.New("the manifest lists no shard")
	}
	return files, nil
}

// compareInChild runs compare in a child process (see checkMode).
func compareInChild(ctx context.Context, self string, rllmFiles []string, duckFile string, sample int, seed uint64) (check, error) {
	return compareWithInChild(ctx, self, rllmFiles, []string{"--duckdb-out", duckFile}, sample, seed)
}

// compareWithInChild is compareInChild against the output other names:
// --duckdb-out FILE or --against-root ROOT (another rllm-pipe output).
func compareWithInChild(ctx context.Context, self string, rllmFiles, other []string, sample int, seed uint64) (check, error) {
	var ck check
	args := append(append([]string{checkMode}, other...), "--sample", strconv.Itoa(sample), "--seed", strconv.FormatUint(seed, 10), "--")
	cmd := exec.CommandContext(ctx, self, append(args, rllmFiles...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return ck, fmt.Errorf("check child: %w: %s", err, strings.TrimSpace(errOut.String()))
	}
	if err := json.Unmarshal(out.Bytes(), &ck); err != nil {
		return ck, fmt.Errorf("check child output %q: %w", out.String(), err)
	}
	return ck, nil
}

// checkChild is the check child: it compares the outputs named by args
// and prints the check as JSON.
func checkChild(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet(checkMode, flag.ContinueOnError)
	duckFile := fs.String("duckdb-out", "", "DuckDB's output file")
	against := fs.String("against-root", "", "compare with the shards of this rllm-pipe output root instead of DuckDB's file")
	sample := fs.Int("sample", 2000, "step_ids sampled")
	seed := fs.Uint64("seed", 0, "sample seed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	other := fmt.Sprintf("read_parquet(%s, hive_partitioning=false)", sqlString(*duckFile))
	if *against != "" {
		var r runResult
		files, err := rllmOutput(*against, &r)
		if err != nil {
			return err
		}
		other = wholeSource(files)
	}
	ck, err := compare(ctx, fs.Args(), other, *sample, *seed)
	if err != nil {
		return err
	}
	// JSON has no NaN: a non-finite difference travels as -1 (Problem
	// and OK already say what went wrong).
	for _, f := range []*float64{&ck.MaxAdvantageErr, &ck.MaxRewardErr} {
		if math.IsNaN(*f) || math.IsInf(*f, 0) {
			*f = -1
		}
	}
	return json.NewEncoder(stdout).Encode(ck)
}

// compare checks the two outputs agree: equal row counts, and for a random
// sample of DuckDB's step_ids the same row in rllm-pipe's shards with the
// same trajectory, reward, advantage (within 1e-9), policy and group
// versions, token ids, logprobs and messages.
func compare(ctx context.Context, rllmFiles []string, duckSrc string, sample int, seed uint64) (check, error) {
	var ck check
	db, err := sql.Open("duckdb", "")
	if err != nil {
		return ck, err
	}
	defer db.Close()
	rllmSrc := wholeSource(rllmFiles)
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+rllmSrc).Scan(&ck.RowsRLLM); err != nil {
		return ck, err
	}
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+duckSrc).Scan(&ck.RowsDuckDB); err != nil {
		return ck, err
	}
	q := fmt.Sprintf(`
WITH d AS (
  SELECT step_id, trajectory_id, reward, advantage, policy_version, group_version, prompt_ids, response_ids, response_logprobs, messages
  FROM %s USING SAMPLE reservoir(%d ROWS) REPEATABLE (%d)
), r AS (
  SELECT step_id, trajectory_id, reward, advantage, policy_version, group_version, prompt_ids, response_ids, response_logprobs, messages
  FROM %s WHERE step_id IN (SELECT step_id FROM d)
)
SELECT count(*), count(r.step_id),
       coalesce(max(abs(d.advantage - r.advantage)), 0), coalesce(max(abs(d.reward - r.reward)), 0),
       count(*) FILTER (WHERE r.step_id IS NOT NULL AND (d.trajectory_id IS DISTINCT FROM r.trajectory_id
         OR d.policy_version IS DISTINCT FROM r.policy_version OR d.group_version IS DISTINCT FROM r.group_version
         OR d.prompt_ids IS DISTINCT FROM r.prompt_ids OR d.response_ids IS DISTINCT FROM r.response_ids
         OR d.response_logprobs IS DISTINCT FROM r.response_logprobs OR d.messages IS DISTINCT FROM r.messages)),
       count(*) FILTER (WHERE r.step_id IS NOT NULL AND (isnan(r.advantage) OR isnan(d.advantage)))
FROM d LEFT JOIN r USING (step_id)`, duckSrc, sample, seed%(1<<31), rllmSrc)
	var nanRows int64
	if err := db.QueryRowContext(ctx, q).Scan(&ck.Sampled, &ck.Matched, &ck.MaxAdvantageErr, &ck.MaxRewardErr, &ck.OtherMismatches, &nanRows); err != nil {
		return ck, err
	}
	var problems []string
	if ck.RowsRLLM != ck.RowsDuckDB {
		problems = append(problems, fmt.Sprintf("rows: rllm-pipe %d, duckdb %d", ck.RowsRLLM, ck.RowsDuckDB))
	}
	if ck.Sampled == 0 {
		problems = append(problems, "empty sample")
	}
	if ck.Matched != ck.Sampled {
		problems = append(problems, fmt.Sprintf("%d of %d sampled step_ids found once in rllm-pipe's output", ck.Matched, ck.Sampled))
	}
	if nanRows > 0 {
		problems = append(problems, fmt.Sprintf("%d sampled rows with a NaN advantage", nanRows))
	}
	if ck.MaxAdvantageErr > 1e-9 || math.IsNaN(ck.MaxAdvantageErr) {
		problems = append(problems, fmt.Sprintf("advantages differ by up to %g", ck.MaxAdvantageErr))
	}
	if ck.MaxRewardErr > 1e-12 || math.IsNaN(ck.MaxRewardErr) {
		problems = append(problems, fmt.Sprintf("rewards differ by up to %g", ck.MaxRewardErr))
	}
	if ck.OtherMismatches > 0 {
		problems = append(problems, fmt.Sprintf("%d sampled rows differ in trajectory, policy or group version, token ids, logprobs or messages", ck.OtherMismatches))
	}
	ck.OK = len(problems) == 0
	ck.Problem = strings.Join(problems, "; ")
	return ck, nil
}

func summarise(rep *report) {
	var rw, dw, ratios []float64
	var rr, dr []int64
	for _, p := range rep.Pairs {
		rw = append(rw, p.RLLM.WallSeconds)
		dw = append(dw, p.DuckDB.WallSeconds)
		ratios = append(ratios, p.Ratio)
		rr = append(rr, p.RLLM.PeakRSS)
		dr = append(dr, p.DuckDB.PeakRSS)
		rep.RSSMaxRLLM = max(rep.RSSMaxRLLM, p.RLLM.PeakRSS)
	}
	rep.MedianRLLM, rep.MedianDuckDB = benchkit.Median(rw), benchkit.Median(dw)
	rep.Ratio = benchkit.Median(ratios)
	rep.RatioOfMedians = rep.MedianDuckDB / rep.MedianRLLM
	rep.RSSMedianRLLM, rep.RSSMedianDuck = int64(benchkit.Median(toF(rr))), int64(benchkit.Median(toF(dr)))
}

func printReport(w io.Writer, rep *report) {
	in := rep.Input
	fmt.Fprintf(w, "input: %s (%s", in.Path, human(in.Bytes))
	if in.Summary != "" {
		fmt.Fprintf(w, "; %s", in.Summary)
	}
	fmt.Fprintf(w, ")\nmachine: %d CPUs\n\n", rep.CPUs)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "pair\trllm-pipe wall\tcpu\tpeak RSS\tshards\t|\tDuckDB wall\tcpu\tpeak RSS\t|\tDuckDB/rllm-pipe\tcheck\t")
	for i, p := range rep.Pairs {
		ok := "ok"
		if !p.Check.OK {
			ok = "FAILED"
		}
		fmt.Fprintf(tw, "%d\t%.2f s\t%.2f\t%s\t%s\t|\t%.2f s\t%.2f\t%s\t|\t%.2f\t%s\t\n", i+1,
			p.RLLM.WallSeconds, p.RLLM.CPUUse, mib(p.RLLM.PeakRSS), human(p.RLLM.OutputBytes),
			p.DuckDB.WallSeconds, p.DuckDB.CPUUse, mib(p.DuckDB.PeakRSS), p.Ratio, ok)
	}
	fmt.Fprintf(tw, "median\t%.2f s\t\t%s\t\t|\t%.2f s\t\t%s\t|\t%.2f\t\t\n",
		rep.MedianRLLM, mib(rep.RSSMedianRLLM), rep.MedianDuckDB, mib(rep.RSSMedianDuck), rep.Ratio)
	tw.Flush()
	fmt.Fprintf(w, "\nratio DuckDB wall / rllm-pipe wall: %.2f (median of pairs; ratio of medians %.2f; pairs %s)\n", rep.Ratio, rep.RatioOfMedians, spread(rep.Pairs, func(p pair) float64 { return p.Ratio }))
	fmt.Fprintf(w, "rllm-pipe wall: %.2f s median (%s); DuckDB wall: %.2f s median (%s)\n",
		rep.MedianRLLM, spread(rep.Pairs, func(p pair) float64 { return p.RLLM.WallSeconds }),
		rep.MedianDuckDB, spread(rep.Pairs, func(p pair) float64 { return p.DuckDB.WallSeconds }))
	fmt.Fprintf(w, "rllm-pipe peak RSS: %s median, %s max\n", mib(rep.RSSMedianRLLM), mib(rep.RSSMaxRLLM))
	if n := len(rep.Pairs); n > 0 {
		p := rep.Pairs[n-1]
		fmt.Fprintf(w, "outputs: rllm-pipe %d rows in %d shards (%s), DuckDB %d rows in one file (%s); DuckDB's COPY alone %.2f s\n",
			p.RLLM.Rows, p.RLLM.OutputFiles, human(p.RLLM.OutputBytes), p.DuckDB.Rows, human(p.DuckDB.OutputBytes), p.DuckDB.QuerySeconds)
		if p.DuckDB.OutputBytes > 0 {
			// Issue 7's aim holds for the 1-4-step shapes; the agent shapes'
			// aims are issue 16's, printed by the multi-turn comparison.
			aim := ""
			if strings.HasPrefix(rep.Shape, "steps") {
				aim = " (aim: at most 1.10)"
			}
			fmt.Fprintf(w, "shard size: rllm-pipe / DuckDB = %.3f%s\n", float64(p.RLLM.OutputBytes)/float64(p.DuckDB.OutputBytes), aim)
		}
		fmt.Fprintf(w, "check (last pair): rows %d = %d; %d of %d sampled step_ids matched, max |Δadvantage| %.3g, max |Δreward| %.3g\n",
			p.Check.RowsRLLM, p.Check.RowsDuckDB, p.Check.Matched, p.Check.Sampled, p.Check.MaxAdvantageErr, p.Check.MaxRewardErr)
	}
	var others []string
	noisy := false
	for _, p := range rep.Pairs {
		others = append(others, fmt.Sprintf("%.2f/%.2f", p.RLLM.OtherCPU, p.DuckDB.OtherCPU))
		noisy = noisy || p.RLLM.OtherCPU > 0.2 || p.DuckDB.OtherCPU > 0.2
	}
	fmt.Fprintf(w, "other work on the machine during each run, in cores (rllm-pipe/DuckDB): %s\n", strings.Join(others, "  "))
	if noisy {
		fmt.Fprintf(w, "note: other processes used more than 0.2 core during some runs; the timings are noisy\n")
	}
}

// wholeSource is a DuckDB relation of rllm-pipe shards with whole
// prompts and messages (multi-turn prompts are stored as prefix deltas).
func wholeSource(files []string) string {
	quoted := make([]string, len(files))
	for i, f := range files {
		quoted[i] = sqlString(f)
	}
	return "(" + duckdb.WholePrompts(fmt.Sprintf("SELECT *, filename AS shard FROM read_parquet([%s], hive_partitioning=false, filename=true)", strings.Join(quoted, ", "))) + ")"
}

// spread is "min–max" of f over the pairs.
func spread(ps []pair, f func(pair) float64) string {
	if len(ps) == 0 {
		return "-"
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, p := range ps {
		lo, hi = min(lo, f(p)), max(hi, f(p))
	}
	return fmt.Sprintf("%.2f–%.2f", lo, hi)
}

func toF(v []int64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

func human(b int64) string {
	switch {
	case b >= 1e9:
		return fmt.Sprintf("%.2f GB", float64(b)/1e9)
	case b >= 1e6:
		return fmt.Sprintf("%.1f MB", float64(b)/1e6)
	default:
		return fmt.Sprintf("%d B", b)
	}
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

func sqlString(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
