// Command scalebench measures how Kafka ingest scales across workers: 1
// and then 2 `rllm-pipe ingest` processes, each pinned to one core
// (GOMAXPROCS=1, taskset -c N), in one consumer group over a 4-partition
// topic, into MinIO (one shared prefix) and into local folders (one per
// worker: a local root has one writer), alternating in rounds. It prints
// each run, the median and spread per case, the scaling efficiency
// (throughput of 2 / 2x throughput of 1) and where the CPU went: the
// workers, the Kafka broker, MinIO and everything else on the machine.
//
// With --summarize it instead reads `go test -bench` output on stdin and
// prints the median and min–max of every metric per benchmark (for
// -count N runs), which is how scripts/bench-scale.sh reports the
// manifest and consumer-group benchmarks.
//
// It is a benchmark harness, not part of the product: it shells out to
// the binary under test and reads the output roots' manifests.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rllm-pipe/rllm-pipe/cmd/internal/benchkit"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/s3"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

type options struct {
	bin, work, brokers, endpoint, bucket string
	groups, rounds, partitions           int
	outputs                              string
	kafkaPid, minioPid                   int
	timeout                              time.Duration
	extra                                string
}

func main() {
	var o options
	summarize := flag.Bool("summarize", false, "read `go test -bench` output on stdin and print median and min–max per benchmark and metric")
	flag.StringVar(&o.bin, "bin", "bin/rllm-pipe", "the rllm-pipe binary to measure")
	flag.StringVar(&o.work, "work", filepath.Join(os.TempDir(), "rllm-scalebench"), "folder for the generated input and local outputs")
	flag.StringVar(&o.brokers, "brokers", os.Getenv("RLLM_PIPE_KAFKA_BROKERS"), "Kafka brokers (host:port,...)")
	flag.StringVar(&o.endpoint, "s3-endpoint", os.Getenv("RLLM_PIPE_S3_ENDPOINT"), "MinIO endpoint (credentials from AWS_* variables)")
	flag.StringVar(&o.bucket, "bucket", "rllm-pipe-bench", "MinIO bucket for the outputs")
	flag.IntVar(&o.groups, "groups", 6000, "groups of 8 generated (6000: ~675 MB, 178k records)")
	flag.IntVar(&o.rounds, "rounds", 3, "rounds; each runs every case once, 1 and 2 workers alternating which goes first")
	flag.IntVar(&o.partitions, "partitions", 4, "partitions of the topic")
	flag.StringVar(&o.outputs, "outputs", "s3,local", "outputs to measure: s3, local")
	flag.IntVar(&o.kafkaPid, "kafka-pid", 0, "the broker's pid, for its CPU use (default: from scripts/services.sh status)")
	flag.IntVar(&o.minioPid, "minio-pid", 0, "MinIO's pid, for its CPU use (default: from scripts/services.sh status)")
	flag.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up on a run after this long")
	flag.StringVar(&o.extra, "ingest-flags", "", "extra flags for every ingest, space-separated")
	flag.Parse()
	if *summarize {
		if err := summarizeBench(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "scalebench:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(context.Background(), o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "scalebench:", err)
		os.Exit(1)
	}
}

// trial is one run of one case.
type trial struct {
	output  string
	workers int
	round   int
	wall    time.Duration // start of the processes to every record settled
	steady  time.Duration // first commit to every record settled
	atFirst int64         // records settled at the first commit
	middle  time.Duration // from 40% to 90% of the records settled
	cpu     cpuUse
	layout  string // partitions per worker
	finish  []time.Duration
}

func run(ctx context.Context, o options, out io.Writer) error {
	if o.brokers == "" {
		return errors.New("no Kafka brokers: set RLLM_PIPE_KAFKA_BROKERS (eval \"$(scripts/services.sh env)\")")
	}
	if o.kafkaPid == 0 || o.minioPid == 0 {
		k, m := servicePids()
		o.kafkaPid = cmp(o.kafkaPid, k)
		o.minioPid = cmp(o.minioPid, m)
	}
	if err := os.MkdirAll(o.work, 0o755); err != nil {
		return err
	}
	id := newID()
	in := filepath.Join(o.work, fmt.Sprintf("scale-%d.jsonl", o.groups))
	if _, err := os.Stat(in); err != nil {
		if out, err := exec.Command(o.bin, "gen", "--to", in, "--groups", strconv.Itoa(o.groups), "--group-size", "8",
			"--prompt-len", "256", "--response-len", "128", "--messages=false", "--seed", "19", "--quiet").CombinedOutput(); err != nil {
			return fmt.Errorf("gen: %v\n%s", err, out)
		}
	}
	info, err := os.Stat(in)
	if err != nil {
		return err
	}
	records, err := benchkit.CountLines(in)
	if err != nil {
		return err
	}
	topic := "scale-" + id
	if out, err := exec.Command(o.bin, "produce", "--to", "kafka://"+o.brokers+"/"+topic, "--kafka-partitions", strconv.Itoa(o.partitions), "--quiet", in).CombinedOutput(); err != nil {
		return fmt.Errorf("produce: %v\n%s", err, out)
	}
	mib := float64(info.Size()) / (1 << 20)
	fmt.Fprintf(out, "scalebench: %s, %.0f MiB, %d records, topic %s with %d partitions; %d cores; kafka pid %d, minio pid %d\n",
		in, mib, records, topic, o.partitions, runtime.NumCPU(), o.kafkaPid, o.minioPid)
	var trials []trial
	outputs := strings.Split(o.outputs, ",")
	for r := 1; r <= o.rounds; r++ {
		order := []int{1, 2}
		if r%2 == 0 {
			order = []int{2, 1}
		}
		for _, output := range outputs {
			for _, w := range order {
				t, err := runTrial(ctx, o, topic, output, w, records)
				if err != nil {
					return fmt.Errorf("round %d, %s, %d workers: %w", r, output, w, err)
				}
				t.round = r
				trials = append(trials, t)
				fmt.Fprintf(out, "  round %d  %-5s  %d worker(s): %6.1f MiB/s wall, %6.1f MiB/s from the first commit, %6.1f MiB/s from 40%% to 90%% settled; partitions per worker %s; cpu: workers %.2f, kafka %.2f, minio %.2f, harness %.2f, other %.2f cores\n",
					r, output, w, mib/t.wall.Seconds(), steadyMiB(t, mib, records), middleMiB(t, mib), t.layout, t.cpu.workers, t.cpu.kafka, t.cpu.minio, t.cpu.harness, t.cpu.other)
			}
		}
	}
	report(out, trials, mib, records, o)
	return nil
}

func cmp(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

func steadyMiB(t trial, mib float64, records int64) float64 {
	return mib * float64(records-t.atFirst) / float64(records) / t.steady.Seconds()
}

// Marks of the steady-state window: the rate between them leaves out the
// consumer-group join and rebalance at the start (the first worker to
// join takes every partition, then hands some over) and the last commits.
const lowMark, highMark = 0.4, 0.9

// middleMiB is the throughput while the records between the marks
// settled.
func middleMiB(t trial, mib float64) float64 {
	return mib * (highMark - lowMark) / t.middle.Seconds()
}

// runTrial runs workers ingest processes to the end of the topic.
func runTrial(ctx context.Context, o options, topic, output string, workers int, records int64) (trial, error) {
	t := trial{output: output, workers: workers}
	id := newID()
	group := "scale-" + id
	var roots []string
	var s3cfg s3.Config
	switch output {
	case "s3":
		if o.endpoint == "" {
			return t, errors.New("no MinIO endpoint: set RLLM_PIPE_S3_ENDPOINT")
		}
		var err error
		if s3cfg, err = s3.ParseURL("s3://" + o.bucket + "/scale-" + id); err != nil {
			return t, err
		}
		s3cfg.Endpoint = o.endpoint
		defer func() { // the run's output goes with it, as the local folders do
			if st, err := s3.OpenReader(context.WithoutCancel(ctx), s3cfg, "scalebench"); err == nil {
				_, _ = st.DeleteAll(context.WithoutCancel(ctx))
			}
		}()
		for range workers {
			roots = append(roots, "s3://"+o.bucket+"/scale-"+id)
		}
	case "local":
		for w := range workers {
			roots = append(roots, filepath.Join(o.work, "out-"+id, fmt.Sprintf("w%d", w)))
		}
		defer os.RemoveAll(filepath.Join(o.work, "out-"+id))
	default:
		return t, fmt.Errorf("unknown output %q (s3, local)", output)
	}
	before := sampleCPU(o)
	start := time.Now()
	var procs []*exec.Cmd
	stopAll := func() {
		for _, p := range procs {
			_ = p.Process.Signal(syscall.SIGTERM)
		}
		for _, p := range procs {
			done := make(chan struct{})
			go func() {
				select {
				case <-done:
				case <-time.After(30 * time.Second):
					_ = p.Process.Kill()
				}
			}()
			_ = p.Wait()
			close(done)
		}
	}
	for w := range workers {
		args := []string{"-c", strconv.Itoa(w % runtime.NumCPU()), o.bin, "ingest",
			"--from", "kafka://" + o.brokers + "/" + topic + "?group=" + group, "--to", roots[w],
			"--group-size", "8", "--flush-interval", "1s", "--decoders", "1", "--encoders", "1", "--quiet"}
		args = append(args, strings.Fields(o.extra)...)
		c := exec.Command("taskset", args...)
		c.Env = append(os.Environ(), "GOMAXPROCS=1")
		c.Stderr = os.Stderr
		if err := c.Start(); err != nil {
			stopAll()
			return t, err
		}
		procs = append(procs, c)
	}
	var observer *s3.Store // one reader, following the log's tail
	settled := func() (schemas.Settled, map[string]map[string]bool, error) {
		all := schemas.Settled{}
		owners := map[string]map[string]bool{} // worker → streams
		if output == "s3" {
			if observer == nil {
				st, err := s3.OpenReader(ctx, s3cfg, "scalebench")
				if err != nil {
					return all, owners, nil // the bucket is not there yet
				}
				observer = st
			}
			es, err := observer.Entries(ctx)
			if err != nil {
				return nil, nil, err
			}
			for _, e := range es {
				note(all, owners, e.Writer, e.Settled)
			}
			return all, owners, nil
		}
		for w, root := range roots {
			es, err := local.ReadManifest(root)
			if err != nil {
				continue // not created yet
			}
			for _, e := range es {
				note(all, owners, "w"+strconv.Itoa(w), e.Settled)
			}
		}
		return all, owners, nil
	}
	deadline := start.Add(o.timeout)
	var first, low, high time.Time
	grew := map[string]time.Duration{} // partition → when its settled range last grew
	sizes := map[string]int64{}
	var owners map[string]map[string]bool
	for {
		all, own, err := settled()
		if err != nil {
			stopAll()
			return t, err
		}
		owners = own
		n := count(all)
		now := time.Now()
		if n > 0 && first.IsZero() {
			first, t.atFirst = now, n
		}
		if low.IsZero() && float64(n) >= lowMark*float64(records) {
			low = now
		}
		if high.IsZero() && float64(n) >= highMark*float64(records) {
			high = now
			t.middle = high.Sub(low)
		}
		for s, r := range all {
			if r.Len() != sizes[s] {
				sizes[s], grew[s] = r.Len(), now.Sub(start)
			}
		}
		if n >= records {
			t.wall, t.steady = now.Sub(start), now.Sub(first)
			break
		}
		if now.After(deadline) {
			stopAll()
			return t, fmt.Errorf("%d of %d records settled after %s", n, records, o.timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	after := sampleCPU(o)
	stopAll()
	var workerCPU time.Duration
	for _, p := range procs {
		if p.ProcessState != nil {
			workerCPU += p.ProcessState.UserTime() + p.ProcessState.SystemTime()
		}
	}
	t.cpu = cpuBetween(before, after, workerCPU, t.wall)
	t.layout = layout(owners)
	var parts []string
	for s := range grew {
		parts = append(parts, s)
	}
	sort.Strings(parts)
	for _, s := range parts {
		t.finish = append(t.finish, grew[s])
	}
	return t, nil
}

func note(all schemas.Settled, owners map[string]map[string]bool, writer string, s schemas.Settled) {
	all.Union(s)
	if len(s) == 0 {
		return
	}
	if owners[writer] == nil {
		owners[writer] = map[string]bool{}
	}
	for stream := range s {
		owners[writer][stream] = true
	}
}

func count(s schemas.Settled) int64 {
	var n int64
	for _, r := range s {
		n += r.Len()
	}
	return n
}

// layout says how many partitions each worker settled records of, e.g.
// "2+2" (a worker that held a partition before a rebalance counts it).
func layout(owners map[string]map[string]bool) string {
	var ns []int
	for _, s := range owners {
		ns = append(ns, len(s))
	}
	sort.Sort(sort.Reverse(sort.IntSlice(ns)))
	var parts []string
	for _, n := range ns {
		parts = append(parts, strconv.Itoa(n))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, "+")
}

// cpuSample is the CPU time used so far by the machine and the services.
type cpuSample struct {
	busy, kafka, minio time.Duration
	self               time.Duration
}

type cpuUse struct {
	workers, kafka, minio, harness, other float64 // cores, averaged over the run
}

func sampleCPU(o options) cpuSample {
	busy, _ := benchkit.MachineBusy()
	return cpuSample{busy: busy, kafka: procCPU(o.kafkaPid), minio: procCPU(o.minioPid), self: procCPU(os.Getpid())}
}

func cpuBetween(a, b cpuSample, workers, wall time.Duration) cpuUse {
	s := wall.Seconds()
	u := cpuUse{workers: workers.Seconds() / s, kafka: (b.kafka - a.kafka).Seconds() / s, minio: (b.minio - a.minio).Seconds() / s, harness: (b.self - a.self).Seconds() / s}
	u.other = max(0, (b.busy-a.busy).Seconds()/s-u.workers-u.kafka-u.minio-u.harness)
	return u
}

// clkTck is the kernel's clock tick in Hz (USER_HZ): 100 on Linux.
const clkTck = 100

// procCPU is the user and system time of pid so far, from /proc (0 when
// it cannot be read).
func procCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command, which is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / clkTck
}

// servicePids reads the broker's and MinIO's pids from scripts/services.sh.
func servicePids() (kafkaPid, minioPid int) {
	out, err := exec.Command("scripts/services.sh", "status").Output()
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "pid" {
				pid, _ := strconv.Atoi(f[i+1])
				switch f[0] {
				case "kafka":
					kafkaPid = pid
				case "minio":
					minioPid = pid
				}
			}
		}
	}
	return kafkaPid, minioPid
}

func newID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// report prints the table of cases and the scaling efficiency.
func report(out io.Writer, trials []trial, mib float64, records int64, o options) {
	fmt.Fprintf(out, "\nKafka → ingest workers (GOMAXPROCS=1, taskset one core each, --decoders 1 --encoders 1), %d partitions, %.0f MiB; median of %d rounds (min–max)\n", o.partitions, mib, o.rounds)
	fmt.Fprintf(out, "%-6s %-8s %-26s %-26s %-26s %-14s %-8s %-8s %-8s\n", "output", "workers", "MiB/s wall (join incl.)", "MiB/s from first commit", "MiB/s 40-90% settled", "worker cores", "kafka", "minio", "other")
	byCase := map[string][]trial{}
	for _, t := range trials {
		k := t.output + "/" + strconv.Itoa(t.workers)
		byCase[k] = append(byCase[k], t)
	}
	for _, output := range strings.Split(o.outputs, ",") {
		for _, w := range []int{1, 2} {
			ts := byCase[output+"/"+strconv.Itoa(w)]
			var wall, steady, middle, wc, kc, mc, oc []float64
			for _, t := range ts {
				wall = append(wall, mib/t.wall.Seconds())
				steady = append(steady, steadyMiB(t, mib, records))
				middle = append(middle, middleMiB(t, mib))
				wc, kc, mc, oc = append(wc, t.cpu.workers), append(kc, t.cpu.kafka), append(mc, t.cpu.minio), append(oc, t.cpu.other)
			}
			fmt.Fprintf(out, "%-6s %-8d %-26s %-26s %-26s %-14s %-8s %-8s %-8s\n", output, w, benchkit.Spread(wall, 1), benchkit.Spread(steady, 1), benchkit.Spread(middle, 1),
				fmt.Sprintf("%.2f", benchkit.Median(wc)), fmt.Sprintf("%.2f", benchkit.Median(kc)), fmt.Sprintf("%.2f", benchkit.Median(mc)), fmt.Sprintf("%.2f", benchkit.Median(oc)))
		}
	}
	fmt.Fprintf(out, "\nscaling efficiency = throughput(2 workers) / (2 × throughput(1 worker)), per round (the pair run back to back), median (min–max); aim ≥ 0.85\n")
	for _, output := range strings.Split(o.outputs, ",") {
		one, two := byCase[output+"/1"], byCase[output+"/2"]
		var wall, steady, middle, perCPU []float64
		for i := range min(len(one), len(two)) {
			wall = append(wall, one[i].wall.Seconds()/two[i].wall.Seconds()/2)
			steady = append(steady, steadyMiB(two[i], mib, records)/steadyMiB(one[i], mib, records)/2)
			middle = append(middle, middleMiB(two[i], mib)/middleMiB(one[i], mib)/2)
			// Bytes per worker CPU-second, 2 workers against 1: below 1 when
			// splitting the topic costs work; the throughput ratios are also
			// bounded by the cores the workers were given.
			perCPU = append(perCPU, (one[i].cpu.workers*one[i].wall.Seconds())/(two[i].cpu.workers*two[i].wall.Seconds()))
		}
		fmt.Fprintf(out, "  %-6s wall %s   from first commit %s   40-90%% settled %s   MiB per worker CPU-second, 2 vs 1: %s\n", output, benchkit.Spread(wall, 2), benchkit.Spread(steady, 2), benchkit.Spread(middle, 2), benchkit.Spread(perCPU, 2))
	}
	fmt.Fprintf(out, "  (a worker pinned to a core reaches 1.00 core only when nothing else runs there: see the cores columns)\n")
	fmt.Fprintf(out, "\nper-partition finish (s after start; last growth of its settled range), 2-worker runs:\n")
	for _, t := range trials {
		if t.workers != 2 {
			continue
		}
		var fs []string
		for _, f := range t.finish {
			fs = append(fs, fmt.Sprintf("%.1f", f.Seconds()))
		}
		fmt.Fprintf(out, "  round %d %-5s partitions per worker %-5s finish %s\n", t.round, t.output, t.layout, strings.Join(fs, " "))
	}
	fmt.Fprintf(out, "\nCores: the machine has %d; the broker and MinIO run on the same cores as the workers (cannot be pinned elsewhere),\n"+
		"so their columns are CPU taken from the workers; \"other\" is the rest of the machine (other users; this harness's own polling excluded).\n", runtime.NumCPU())
}

// summarizeBench reads `go test -bench` lines and prints, per benchmark,
// the median and min–max of every metric over its runs.
func summarizeBench(in io.Reader, out io.Writer) error {
	type series struct {
		units []string
		vals  map[string][]float64
	}
	var order []string
	by := map[string]*series{}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	// A log line the benchmark printed while it ran lands after its
	// name, on the same line; its result then comes on a line of its
	// own: pending is that name.
	pending := ""
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && strings.HasPrefix(f[0], "Benchmark") {
			if _, err := strconv.Atoi(f[1]); err != nil {
				pending = f[0]
				continue
			}
		} else if len(f) >= 3 && pending != "" && slices.Contains(f, "ns/op") {
			if _, err := strconv.Atoi(f[0]); err == nil {
				f = append([]string{pending}, f...)
			}
		}
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		pending = ""
		name := f[0]
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i]
			}
		}
		s := by[name]
		if s == nil {
			s = &series{vals: map[string][]float64{}}
			by[name] = s
			order = append(order, name)
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil || f[i+1] == "ns/op" {
				continue
			}
			u := f[i+1]
			if s.vals[u] == nil {
				s.units = append(s.units, u)
			}
			s.vals[u] = append(s.vals[u], v)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	for _, name := range order {
		s := by[name]
		var cells []string
		runs := 0
		for _, u := range s.units {
			runs = max(runs, len(s.vals[u]))
			cells = append(cells, fmt.Sprintf("%s %s", benchkit.Spread(s.vals[u], precision(s.vals[u])), u))
		}
		fmt.Fprintf(out, "%-58s runs %d: %s\n", strings.TrimPrefix(name, "Benchmark"), runs, strings.Join(cells, ", "))
	}
	return nil
}

func precision(xs []float64) int {
	if benchkit.Median(xs) >= 100 {
		return 0
	}
	if benchkit.Median(xs) >= 10 {
		return 1
	}
	return 2
}
