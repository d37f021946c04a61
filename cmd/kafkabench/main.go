// Command kafkabench is a benchmark-only program (not shipped): it times
// the Kafka path of ingest against its two yardsticks on the same input,
// the measurement of issue 19.
//
// Four contenders run on one generated input (the `bench-ingest` "steps"
// shape, cached under --work and shared with cmd/ingestbench), produced
// once into a fresh topic of --partitions partitions:
//
//	drain      a bare kafka-go drain of the topic, in this process: one
//	           kafka.Conn per partition reading with Conn.ReadBatch (64 MiB
//	           fetches), every message's value read out; the fastest way
//	           kafka-go reads a topic as it ships (faster than a Reader,
//	           see --drain)
//	drain-buf  the same with ingest's fetch connections
//	           (kafka.WithReadBuffer: a 256 KiB read buffer under kafka-go's
//	           4 KiB one), the fastest drain we know
//	kafka      rllm-pipe ingest --from kafka://…/topic?group=NEW --to s3://bucket/NEW
//	file       rllm-pipe ingest --from IN --to DIR (a local directory)
//
// Every run also charges the Kafka broker and MinIO, which share the
// machine, the CPU they used during it (from /proc).
//
// A Kafka ingest never sees the end of its input, so the program follows
// the child's --metrics-addr and sends SIGTERM once it has read every
// record: a soft stop commits every assembled group (every group is
// complete), as the end of a file does. Its time runs from the start of
// the process to its exit, like the file ingest's, so both include
// start-up (for Kafka: joining the group, claiming partitions in the
// manifest). After each Kafka run the manifest must settle every offset
// of the topic, and after each file run list every line: a run that
// dropped records fails the benchmark. Each run's output is deleted once
// checked.
//
// One warm-up round (all of them, discarded) comes first, then --rounds
// rounds, the order of the contenders rotating each round. It prints
// every run, the median and spread (min–max) of each contender's
// throughput in MiB/s of input, and the ratios kafka/file, kafka/drain
// and kafka/drain-buf (median over the rounds of the per-round ratio, with its
// spread), then what the broker's and MinIO's CPU leave of the aims on
// this machine whatever the pipeline costs (see bounds). --json writes
// the same.
//
//	make bench-kafka
//	go run ./cmd/kafkabench --bin bin/rllm-pipe --size 500MB --rounds 3
//	go run ./cmd/kafkabench --rounds 1 --kafka-args "--cpuprofile /tmp/kafka.pprof"
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/rllm-pipe/rllm-pipe/cmd/internal/benchkit"

	kgo "github.com/segmentio/kafka-go"

	"github.com/rllm-pipe/rllm-pipe/connectors/kafka"
	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/s3"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kafkabench:", err)
		os.Exit(1)
	}
}

type config struct {
	bin, work, input   string
	size               int64
	rounds, partitions int
	brokers, endpoint  string
	bucket             string
	drain              string
	kafkaArgs          string
	fileArgs           string
	jsonOut            string
	keepTopic          bool
	topic              string
	contenders         string
}

// genArgs is cmd/ingestbench's "steps" shape, so that both programs share
// one cached input.
var genArgs = []string{"--group-size", "8", "--min-steps", "1", "--max-steps", "4", "--prompt-len", "512", "--response-len", "256"}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	var c config
	var sizeText string
	fs := flag.NewFlagSet("kafkabench", flag.ContinueOnError)
	fs.StringVar(&c.bin, "bin", "bin/rllm-pipe", "the rllm-pipe binary")
	fs.StringVar(&c.work, "work", filepath.Join(os.Getenv("HOME"), ".cache", "rllm-pipe", "bench"), "cache of generated inputs")
	fs.StringVar(&c.input, "input", "", "use this JSON-lines file instead of a generated one")
	fs.StringVar(&sizeText, "size", "1GB", "size of the generated input (B, KB, MB, GB)")
	fs.IntVar(&c.rounds, "rounds", 3, "measured rounds (after one warm-up round)")
	fs.IntVar(&c.partitions, "partitions", 4, "partitions of the topic")
	fs.StringVar(&c.brokers, "brokers", os.Getenv("RLLM_PIPE_KAFKA_BROKERS"), "Kafka brokers (default $RLLM_PIPE_KAFKA_BROKERS)")
	fs.StringVar(&c.endpoint, "endpoint", os.Getenv("RLLM_PIPE_S3_ENDPOINT"), "S3 endpoint (default $RLLM_PIPE_S3_ENDPOINT)")
	fs.StringVar(&c.bucket, "bucket", "rllm-pipe-bench", "bucket of the Kafka ingest's output")
	fs.StringVar(&c.drain, "drain", "batch", "how the drain reads: batch (Conn.ReadBatch per partition) or reader (a Reader per partition)")
	fs.StringVar(&c.kafkaArgs, "kafka-args", "", "extra flags for the Kafka ingest (space separated)")
	fs.StringVar(&c.fileArgs, "file-args", "", "extra flags for the file ingest (space separated)")
	fs.StringVar(&c.jsonOut, "json", "", "also write the results to this file")
	fs.BoolVar(&c.keepTopic, "keep-topic", false, "do not delete the topic at the end")
	fs.StringVar(&c.topic, "topic", "", "read this topic (already holding the input, as --keep-topic leaves it) instead of producing a new one")
	fs.StringVar(&c.contenders, "contenders", "drain,kafka,file,drain-buf", "the contenders to run, in the first round's order (drain, drain-buf, kafka, file)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.brokers == "" || c.endpoint == "" {
		return errors.New("no Kafka or S3: set RLLM_PIPE_KAFKA_BROKERS and RLLM_PIPE_S3_ENDPOINT (eval \"$(scripts/services.sh env)\")")
	}
	var err error
	if c.size, err = benchkit.ParseSize(sizeText); err != nil {
		return err
	}
	if c.rounds < 1 {
		return errors.New("--rounds: at least 1")
	}
	if c.bin, err = filepath.Abs(c.bin); err != nil {
		return err
	}
	in, err := prepareInput(ctx, c, stdout)
	if err != nil {
		return err
	}
	records, err := benchkit.CountLines(in.Path)
	if err != nil {
		return err
	}
	topic := c.topic
	if topic == "" {
		topic = "kafkabench-" + randomID()
		fmt.Fprintf(stdout, "producing %d records (%s) to %s (%d partitions)\n", records, human(in.Bytes), topic, c.partitions)
		start := time.Now()
		if err := runQuiet(ctx, c.bin, nil, "produce", "--to", "kafka://"+c.brokers+"/"+topic, "--kafka-partitions", strconv.Itoa(c.partitions), "--quiet", in.Path); err != nil {
			return fmt.Errorf("produce: %w", err)
		}
		fmt.Fprintf(stdout, "produced in %.1f s\n", time.Since(start).Seconds())
		if !c.keepTopic {
			defer deleteTopic(c.brokers, topic)
		}
	} else {
		// Every contender waits for the input's count of records: a topic
		// holding another count (or none: the broker creates a missing
		// topic on first use) would keep them waiting.
		parts, held, err := topicRecords(ctx, c.brokers, topic)
		if err != nil {
			return fmt.Errorf("--topic %s: %w", topic, err)
		}
		if held != records || parts != c.partitions {
			return fmt.Errorf("--topic %s holds %d records in %d partitions, the input %d records, --partitions %d: produce the input to it first (a run with --keep-topic leaves one)", topic, held, parts, records, c.partitions)
		}
		fmt.Fprintf(stdout, "reading topic %s (%d records, %s)\n", topic, records, human(in.Bytes))
	}

	b := &bench{c: c, in: in, records: records, topic: topic, stdout: stdout}
	contenders := strings.Split(c.contenders, ",")
	var runs []runResult
	for round := 0; round <= c.rounds; round++ {
		order := slices.Clone(contenders)
		rot := round % len(order)
		order = append(order[rot:], order[:rot]...)
		for _, name := range order {
			if err := ctx.Err(); err != nil {
				return err
			}
			r, err := b.run(ctx, name)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round, name, err)
			}
			r.Round = round
			r.MiBs = float64(in.Bytes) / (1 << 20) / r.Wall
			label := strconv.Itoa(round)
			if round == 0 {
				label = "warm-up"
			}
			rss := ""
			if r.RSS > 0 {
				rss = fmt.Sprintf("  peak RSS %.0f MiB", r.RSS)
			}
			fmt.Fprintf(stdout, "  %-8s %-9s %7.2f s %8.1f MiB/s  cpu %5.2f s  broker %4.2f s  minio %4.2f s  other cpu %4.2f cores%s\n", label, name, r.Wall, r.MiBs, r.CPU, r.Broker, r.MinIO, r.OtherCPU, rss)
			if round > 0 {
				runs = append(runs, r)
			}
		}
	}
	rep := summarize(runs, c, in, records)
	rep.print(stdout)
	if c.jsonOut != "" {
		data, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(c.jsonOut, append(data, '\n'), 0o644); err != nil {
			return fmt.Errorf("--json: %w", err)
		}
	}
	return nil
}

type bench struct {
	c       config
	in      inputInfo
	records int64
	topic   string
	stdout  io.Writer
}

type runResult struct {
	Name     string  `json:"name"`
	Round    int     `json:"round"`
	Wall     float64 `json:"wall_seconds"`
	MiBs     float64 `json:"mib_per_second"`
	CPU      float64 `json:"cpu_seconds"`        // the child's user+sys (the drain: this process's)
	OtherCPU float64 `json:"other_cpu_cores"`    // machine CPU not ours, per second of wall
	Broker   float64 `json:"broker_cpu_seconds"` // the Kafka broker's CPU during the run
	MinIO    float64 `json:"minio_cpu_seconds"`  // MinIO's CPU during the run
	First    float64 `json:"first_read_seconds"` // kafka, file: until the first record was read
	Read     float64 `json:"read_seconds"`       // kafka, file: until every record was read
	RSS      float64 `json:"peak_rss_mib"`       // kafka, file: the child's peak resident set
}

// freeAddr returns a loopback address no one listens on (for a child's
// --metrics-addr).
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr, nil
}

// watchReads polls the child's records-read counter at addr every 10 ms
// from start until it reaches records (or exited is closed, or ctx ends):
// the seconds until the first record was read and until the last (0 if
// never seen).
func watchReads(ctx context.Context, addr string, records int64, start time.Time, exited <-chan struct{}) (first, all float64) {
	for {
		if n, ok := metric(addr, "rllm_pipe_records_read_total"); ok {
			if n > 0 && first == 0 {
				first = time.Since(start).Seconds()
			}
			if n >= float64(records) {
				return first, time.Since(start).Seconds()
			}
		}
		select {
		case <-ctx.Done():
			return first, 0
		case <-exited:
			return first, 0
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Command-line marks of the services' processes, for their CPU time.
const (
	brokerProcess = "kafka.Kafka"
	minioProcess  = "minio server"
)

func (b *bench) run(ctx context.Context, name string) (runResult, error) {
	broker0, minio0 := benchkit.ProcessCPU(brokerProcess), benchkit.ProcessCPU(minioProcess)
	var r runResult
	var err error
	switch name {
	case "drain", "drain-buf":
		r, err = b.drainRun(ctx, name)
	case "kafka":
		r, err = b.kafkaRun(ctx)
	case "file":
		r, err = b.fileRun(ctx)
	default:
		return runResult{}, fmt.Errorf("unknown contender %q", name)
	}
	r.Broker = (benchkit.ProcessCPU(brokerProcess) - broker0).Seconds()
	r.MinIO = (benchkit.ProcessCPU(minioProcess) - minio0).Seconds()
	return r, err
}

// drainRun reads every record of the topic with bare kafka-go: its
// connections as kafka-go makes them (drain), or with ingest's read buffer
// under them (drain-buf).
func (b *bench) drainRun(ctx context.Context, name string) (runResult, error) {
	dialer := &kgo.Dialer{Timeout: 10 * time.Second, DualStack: true}
	if name == "drain-buf" {
		dialer = kafka.WithReadBuffer(dialer)
	}
	busy0, _ := benchkit.MachineBusy()
	cpu0 := selfCPU()
	start := time.Now()
	var err error
	var n, bytes int64
	switch b.c.drain {
	case "batch":
		n, bytes, err = drainBatches(ctx, dialer, b.c.brokers, b.topic, b.c.partitions)
	case "reader":
		n, bytes, err = drainReaders(ctx, b.c.brokers, b.topic, b.c.partitions, b.records)
	default:
		err = fmt.Errorf("--drain %q: want batch or reader", b.c.drain)
	}
	wall := time.Since(start).Seconds()
	if err != nil {
		return runResult{}, err
	}
	if n != b.records {
		return runResult{}, fmt.Errorf("drained %d records, want %d", n, b.records)
	}
	_ = bytes
	cpu := selfCPU() - cpu0
	busy1, _ := benchkit.MachineBusy()
	return runResult{Name: name, Wall: wall, CPU: cpu, OtherCPU: max(0, (busy1-busy0).Seconds()-cpu) / wall}, nil
}

// drainBatches reads each partition on its own connection with ReadBatch.
func drainBatches(ctx context.Context, dialer *kgo.Dialer, brokers, topic string, partitions int) (int64, int64, error) {
	var n, size atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, partitions)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ends, err := partitionEnds(ctx, brokers, topic, partitions)
	if err != nil {
		return 0, 0, err
	}
	for p := range partitions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := dialer.DialLeader(ctx, "tcp", strings.Split(brokers, ",")[0], topic, p)
			if err != nil {
				errs[p] = err
				return
			}
			defer conn.Close()
			if _, err := conn.Seek(0, kgo.SeekAbsolute); err != nil {
				errs[p] = err
				return
			}
			off := int64(0)
			for off < ends[p] {
				_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
				batch := conn.ReadBatchWith(kgo.ReadBatchConfig{MinBytes: 1, MaxBytes: 64 << 20, MaxWait: 100 * time.Millisecond})
				for {
					m, err := batch.ReadMessage()
					if err != nil {
						break
					}
					n.Add(1)
					size.Add(int64(len(m.Value)))
					off = m.Offset + 1
				}
				if err := batch.Close(); err != nil {
					errs[p] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	return n.Load(), size.Load(), errors.Join(errs...)
}

// drainReaders reads each partition with its own Reader (no group).
func drainReaders(ctx context.Context, brokers, topic string, partitions int, want int64) (int64, int64, error) {
	var n, size atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, partitions)
	ends, err := partitionEnds(ctx, brokers, topic, partitions)
	if err != nil {
		return 0, 0, err
	}
	for p := range partitions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := kgo.NewReader(kgo.ReaderConfig{Brokers: strings.Split(brokers, ","), Topic: topic, Partition: p,
				MinBytes: 1, MaxBytes: 64 << 20, MaxWait: 100 * time.Millisecond, QueueCapacity: 4096})
			defer r.Close()
			for off := int64(0); off < ends[p]; {
				m, err := r.ReadMessage(ctx)
				if err != nil {
					errs[p] = err
					return
				}
				n.Add(1)
				size.Add(int64(len(m.Value)))
				off = m.Offset + 1
			}
		}()
	}
	wg.Wait()
	return n.Load(), size.Load(), errors.Join(errs...)
}

// topicRecords returns how many partitions topic has and how many
// records they hold. It asks for every topic's metadata: asking for the
// topic's own would make a broker that creates topics on first use create
// a missing one.
func topicRecords(ctx context.Context, brokers, topic string) (partitions int, records int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	deadline, _ := ctx.Deadline()
	broker := strings.Split(brokers, ",")[0]
	conn, err := kgo.DialContext(ctx, "tcp", broker)
	if err != nil {
		return 0, 0, err
	}
	_ = conn.SetDeadline(deadline)
	all, err := conn.ReadPartitions()
	conn.Close()
	if err != nil {
		return 0, 0, err
	}
	for _, p := range all {
		if p.Topic != topic {
			continue
		}
		partitions++
		pc, err := kgo.DialLeader(ctx, "tcp", broker, topic, p.ID)
		if err != nil {
			return 0, 0, err
		}
		_ = pc.SetDeadline(deadline)
		first, last, err := pc.ReadOffsets()
		pc.Close()
		if err != nil {
			return 0, 0, err
		}
		records += last - first
	}
	if partitions == 0 {
		return 0, 0, errors.New("no such topic")
	}
	return partitions, records, nil
}

// partitionEnds returns each partition's last offset + 1.
func partitionEnds(ctx context.Context, brokers, topic string, partitions int) ([]int64, error) {
	ends := make([]int64, partitions)
	for p := range partitions {
		conn, err := kgo.DialLeader(ctx, "tcp", strings.Split(brokers, ",")[0], topic, p)
		if err != nil {
			return nil, err
		}
		ends[p], err = conn.ReadLastOffset()
		conn.Close()
		if err != nil {
			return nil, err
		}
	}
	return ends, nil
}

// kafkaRun runs a Kafka ingest into a new prefix, stops it softly once it
// has read every record, and checks the manifest settles every offset.
func (b *bench) kafkaRun(ctx context.Context) (runResult, error) {
	id := randomID()
	addr, err := freeAddr()
	if err != nil {
		return runResult{}, err
	}
	prefix := "kafkabench-" + id
	args := []string{"ingest", "--from", "kafka://" + b.c.brokers + "/" + b.topic + "?group=kafkabench-" + id,
		"--to", "s3://" + b.c.bucket + "/" + prefix, "--group-size", "8", "--metrics-addr", addr, "--quiet"}
	args = append(args, strings.Fields(b.c.kafkaArgs)...)
	cmd := exec.CommandContext(ctx, b.c.bin, args...)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	busy0, _ := benchkit.MachineBusy()
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return runResult{}, err
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	first, read := watchReads(wctx, addr, b.records, start, exited)
	cancel()
	if ctx.Err() != nil {
		_ = cmd.Process.Kill()
		<-exited
		return runResult{}, ctx.Err()
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	<-exited
	err = waitErr
	wall := time.Since(start).Seconds()
	busy1, _ := benchkit.MachineBusy()
	if err != nil || read == 0 {
		return runResult{}, fmt.Errorf("kafka ingest (read all: %v): %v\n%s", read > 0, err, lastLines(logs.String(), 20))
	}
	cfg, err := s3.ParseURL("s3://" + b.c.bucket + "/" + prefix)
	if err != nil {
		return runResult{}, err
	}
	cfg.Endpoint = b.c.endpoint
	st, err := s3.OpenReader(ctx, cfg, "kafkabench")
	if err != nil {
		return runResult{}, err
	}
	var settled int64
	for _, r := range st.Settled() {
		settled += r.Len()
	}
	if settled != b.records {
		return runResult{}, fmt.Errorf("the manifest settles %d offsets, want %d", settled, b.records)
	}
	// The run's output goes once checked (a run leaves ~18% of its input
	// in MinIO, and MinIO's background scanner would work on it during
	// the next runs).
	if _, err := st.DeleteAll(ctx); err != nil {
		return runResult{}, fmt.Errorf("removing the run's output: %w", err)
	}
	cpu := cmd.ProcessState.UserTime().Seconds() + cmd.ProcessState.SystemTime().Seconds()
	return runResult{Name: "kafka", Wall: wall, First: first, Read: read, CPU: cpu, OtherCPU: max(0, (busy1-busy0).Seconds()-cpu) / wall,
		RSS: peakMiB(cmd.ProcessState)}, nil
}

// fileRun ingests the input file into a new local directory.
func (b *bench) fileRun(ctx context.Context) (runResult, error) {
	out, err := os.MkdirTemp("", "kafkabench-file-")
	if err != nil {
		return runResult{}, err
	}
	defer os.RemoveAll(out)
	addr, err := freeAddr()
	if err != nil {
		return runResult{}, err
	}
	args := []string{"ingest", "--from", b.in.Path, "--to", out, "--group-size", "8", "--metrics-addr", addr, "--quiet"}
	args = append(args, strings.Fields(b.c.fileArgs)...)
	cmd := exec.CommandContext(ctx, b.c.bin, args...)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	busy0, _ := benchkit.MachineBusy()
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return runResult{}, err
	}
	exited := make(chan struct{})
	go func() { err = cmd.Wait(); close(exited) }()
	first, read := watchReads(ctx, addr, b.records, start, exited)
	<-exited
	wall := time.Since(start).Seconds()
	busy1, _ := benchkit.MachineBusy()
	if err != nil {
		return runResult{}, fmt.Errorf("file ingest: %v\n%s", err, lastLines(logs.String(), 20))
	}
	entries, err := local.ReadManifest(out)
	if err != nil {
		return runResult{}, err
	}
	var rows int64
	for _, e := range entries {
		rows += e.Rows
	}
	if rows == 0 {
		return runResult{}, errors.New("file ingest committed no rows")
	}
	cpu := cmd.ProcessState.UserTime().Seconds() + cmd.ProcessState.SystemTime().Seconds()
	return runResult{Name: "file", Wall: wall, First: first, Read: read, CPU: cpu, OtherCPU: max(0, (busy1-busy0).Seconds()-cpu) / wall,
		RSS: peakMiB(cmd.ProcessState)}, nil
}

// peakMiB is a finished child's peak RSS in MiB (0: not reported).
func peakMiB(ps *os.ProcessState) float64 { return float64(benchkit.PeakRSS(ps)) / (1 << 20) }

// metric reads one unlabelled value from a Prometheus text endpoint.
func metric(addr, name string) (float64, bool) {
	cli := http.Client{Timeout: time.Second}
	resp, err := cli.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}

type stat struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

func statOf(xs []float64) stat {
	if len(xs) == 0 {
		return stat{}
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return stat{Median: m, Min: s[0], Max: s[len(s)-1]}
}

type report struct {
	Input      string          `json:"input"`
	InputBytes int64           `json:"input_bytes"`
	Records    int64           `json:"records"`
	Partitions int             `json:"partitions"`
	Rounds     int             `json:"rounds"`
	Runs       []runResult     `json:"runs"`
	MiBs       map[string]stat `json:"mib_per_second"`
	Wall       map[string]stat `json:"wall_seconds"`
	CPU        map[string]stat `json:"cpu_seconds"`
	BrokerCPU  map[string]stat `json:"broker_cpu_seconds"`
	MinIOCPU   map[string]stat `json:"minio_cpu_seconds"`
	PeakRSS    map[string]stat `json:"peak_rss_mib"` // kafka, file
	// Phases of the kafka and file runs: seconds until the first record
	// was read and until the last, and the throughput between the two.
	FirstRead map[string]stat `json:"first_read_seconds"`
	LastRead  map[string]stat `json:"last_read_seconds"`
	Steady    map[string]stat `json:"steady_mib_per_second"`
	// SteadyRatio is kafka/file of the steady throughputs, per round.
	SteadyRatio stat                 `json:"steady_ratio"`
	Ratios      map[string]stat      `json:"ratios"`
	MedianRatio map[string]float64   `json:"ratio_of_medians"`
	Bounds      *bounds              `json:"bounds,omitempty"`
	Extra       map[string]string    `json:"flags,omitempty"`
	byName      map[string][]float64 // MiB/s by contender
}

func summarize(runs []runResult, c config, in inputInfo, records int64) *report {
	rep := &report{Input: in.Path, InputBytes: in.Bytes, Records: records, Partitions: c.partitions, Rounds: c.rounds, Runs: runs,
		MiBs: map[string]stat{}, Wall: map[string]stat{}, CPU: map[string]stat{}, BrokerCPU: map[string]stat{}, MinIOCPU: map[string]stat{}, PeakRSS: map[string]stat{}, Ratios: map[string]stat{}, MedianRatio: map[string]float64{},
		Extra: map[string]string{"kafka_args": c.kafkaArgs, "file_args": c.fileArgs, "drain": c.drain}, byName: map[string][]float64{}}
	walls, cpus := map[string][]float64{}, map[string][]float64{}
	brokers, minios, rss := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	byRound := map[int]map[string]float64{}
	for _, r := range runs {
		rep.byName[r.Name] = append(rep.byName[r.Name], r.MiBs)
		walls[r.Name] = append(walls[r.Name], r.Wall)
		cpus[r.Name] = append(cpus[r.Name], r.CPU)
		brokers[r.Name] = append(brokers[r.Name], r.Broker)
		minios[r.Name] = append(minios[r.Name], r.MinIO)
		if r.RSS > 0 {
			rss[r.Name] = append(rss[r.Name], r.RSS)
		}
		if byRound[r.Round] == nil {
			byRound[r.Round] = map[string]float64{}
		}
		byRound[r.Round][r.Name] = r.MiBs
	}
	for name, xs := range rep.byName {
		rep.MiBs[name] = statOf(xs)
		rep.Wall[name] = statOf(walls[name])
		rep.CPU[name] = statOf(cpus[name])
		rep.BrokerCPU[name] = statOf(brokers[name])
		rep.MinIOCPU[name] = statOf(minios[name])
		if len(rss[name]) > 0 {
			rep.PeakRSS[name] = statOf(rss[name])
		}
	}
	rep.FirstRead, rep.LastRead, rep.Steady = map[string]stat{}, map[string]stat{}, map[string]stat{}
	mib := float64(in.Bytes) / (1 << 20)
	steadyByRound := map[int]map[string]float64{}
	for _, name := range []string{"kafka", "file"} {
		var firsts, lasts, steady []float64
		for _, r := range runs {
			if r.Name != name || r.First <= 0 || r.Read <= r.First {
				continue
			}
			firsts = append(firsts, r.First)
			lasts = append(lasts, r.Read)
			steady = append(steady, mib/(r.Read-r.First))
			if steadyByRound[r.Round] == nil {
				steadyByRound[r.Round] = map[string]float64{}
			}
			steadyByRound[r.Round][name] = mib / (r.Read - r.First)
		}
		if len(steady) > 0 {
			rep.FirstRead[name], rep.LastRead[name], rep.Steady[name] = statOf(firsts), statOf(lasts), statOf(steady)
		}
	}
	var steadyRatios []float64
	for _, m := range steadyByRound {
		if m["kafka"] > 0 && m["file"] > 0 {
			steadyRatios = append(steadyRatios, m["kafka"]/m["file"])
		}
	}
	if len(steadyRatios) > 0 {
		rep.SteadyRatio = statOf(steadyRatios)
	}
	for _, pair := range ratioPairs {
		var xs []float64
		for _, m := range byRound {
			if m[pair[0]] > 0 && m[pair[1]] > 0 {
				xs = append(xs, m[pair[0]]/m[pair[1]])
			}
		}
		if len(xs) == 0 {
			continue
		}
		name := pair[0] + "/" + pair[1]
		rep.Ratios[name] = statOf(xs)
		rep.MedianRatio[name] = rep.MiBs[pair[0]].Median / rep.MiBs[pair[1]].Median
	}
	if b, ok := boundsOf(rep, runtime.NumCPU()); ok {
		rep.Bounds = &b
	}
	return rep
}

// ratioPairs are the ratios reported, of contenders' throughputs.
var ratioPairs = [][2]string{{"kafka", "file"}, {"kafka", "drain"}, {"kafka", "drain-buf"}}

// contenderOrder is the order of the summary's rows.
var contenderOrder = []string{"drain", "drain-buf", "kafka", "file"}

func (rep *report) print(w io.Writer) {
	fmt.Fprintf(w, "\n%s, %d records, %d partitions; median of %d rounds (min–max), after a warm-up round\n", human(rep.InputBytes), rep.Records, rep.Partitions, rep.Rounds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "contender\tMiB/s of input\twall s\tCPU s\tbroker CPU s\tMinIO CPU s")
	for _, name := range contenderOrder {
		if _, ok := rep.MiBs[name]; !ok {
			continue
		}
		m, wl, c, bk, mn := rep.MiBs[name], rep.Wall[name], rep.CPU[name], rep.BrokerCPU[name], rep.MinIOCPU[name]
		fmt.Fprintf(tw, "%s\t%.0f (%.0f–%.0f)\t%.2f (%.2f–%.2f)\t%.2f (%.2f–%.2f)\t%.2f (%.2f–%.2f)\t%.2f (%.2f–%.2f)\n", name, m.Median, m.Min, m.Max,
			wl.Median, wl.Min, wl.Max, c.Median, c.Min, c.Max, bk.Median, bk.Min, bk.Max, mn.Median, mn.Min, mn.Max)
	}
	tw.Flush()
	for _, name := range []string{"kafka", "file"} {
		if m, ok := rep.PeakRSS[name]; ok {
			fmt.Fprintf(w, "%-5s peak RSS %.0f MiB (%.0f–%.0f)\n", name, m.Median, m.Min, m.Max)
		}
	}
	for _, name := range []string{"kafka", "file"} {
		f, ok := rep.FirstRead[name]
		if !ok {
			continue
		}
		l, st, wl := rep.LastRead[name], rep.Steady[name], rep.Wall[name]
		fmt.Fprintf(w, "%-5s first record read after %.2f s (%.2f–%.2f), the last after %.2f s (%.2f–%.2f), exit at %.2f s: %.0f MiB/s (%.0f–%.0f) between the first and the last\n",
			name, f.Median, f.Min, f.Max, l.Median, l.Min, l.Max, wl.Median, st.Median, st.Min, st.Max)
	}
	if r := rep.SteadyRatio; r.Median > 0 {
		fmt.Fprintf(w, "kafka/file between the first and the last record read: %.2f (%.2f–%.2f) per round (start-up, group join and the last commits left out)\n", r.Median, r.Min, r.Max)
	}
	for _, pair := range ratioPairs {
		name := pair[0] + "/" + pair[1]
		r, ok := rep.Ratios[name]
		if !ok {
			continue
		}
		fmt.Fprintf(w, "%-16s %.2f (%.2f–%.2f) per round; ratio of medians %.2f\n", name, r.Median, r.Min, r.Max, rep.MedianRatio[name])
	}
	if rep.Bounds != nil {
		rep.Bounds.print(w, rep.CPU["file"].Median)
	}
}

type inputInfo struct {
	Path    string   `json:"path"`
	Bytes   int64    `json:"bytes"`
	Gen     []string `json:"gen_args"`
	Summary string   `json:"gen_summary"`
	Cached  bool     `json:"cached"`
}

// prepareInput returns --input, or the generated input of --size, cached
// under --work under cmd/ingestbench's name for the same shape.
func prepareInput(ctx context.Context, c config, stdout io.Writer) (inputInfo, error) {
	if c.input != "" {
		st, err := os.Stat(c.input)
		if err != nil {
			return inputInfo{}, fmt.Errorf("--input: %w", err)
		}
		p, _ := filepath.Abs(c.input)
		return inputInfo{Path: p, Bytes: st.Size()}, nil
	}
	name := fmt.Sprintf("traces-%d-seed1", c.size)
	path := filepath.Join(c.work, name+".jsonl")
	metaPath := filepath.Join(c.work, name+".meta.json")
	var meta inputInfo
	if data, err := os.ReadFile(metaPath); err == nil && json.Unmarshal(data, &meta) == nil {
		if st, err := os.Stat(path); err == nil && st.Size() == meta.Bytes && meta.Bytes > 0 {
			meta.Path, meta.Cached = path, true
			fmt.Fprintf(stdout, "input: %s (%s, cached)\n", path, human(meta.Bytes))
			return meta, nil
		}
	}
	if err := os.MkdirAll(c.work, 0o755); err != nil {
		return inputInfo{}, err
	}
	base := append(slices.Clone(genArgs), "--seed", "1")
	const calibration = 256
	var cw bytes.Buffer
	if err := runQuiet(ctx, c.bin, &cw, append(append([]string{"gen"}, base...), "--groups", strconv.Itoa(calibration), "--quiet", "--to", "-")...); err != nil {
		return inputInfo{}, fmt.Errorf("gen (calibration): %w", err)
	}
	groups := max(1, int(math.Round(float64(c.size)*calibration/float64(cw.Len()))))
	args := append(append([]string{"gen"}, base...), "--groups", strconv.Itoa(groups))
	fmt.Fprintf(stdout, "generating %s: rllm-pipe %s\n", human(c.size), strings.Join(args, " "))
	tmp := path + ".tmp"
	if err := runQuiet(ctx, c.bin, nil, append(slices.Clone(args), "--quiet", "--to", tmp)...); err != nil {
		return inputInfo{}, fmt.Errorf("gen: %w", err)
	}
	st, err := os.Stat(tmp)
	if err != nil {
		return inputInfo{}, err
	}
	if err := os.Rename(tmp, path); err != nil {
		return inputInfo{}, err
	}
	meta = inputInfo{Path: path, Bytes: st.Size(), Gen: args}
	data, _ := json.MarshalIndent(meta, "", "  ")
	if err := os.WriteFile(metaPath, append(data, '\n'), 0o644); err != nil {
		return inputInfo{}, err
	}
	return meta, nil
}

func runQuiet(ctx context.Context, bin string, stdout io.Writer, args ...string) error {
	cmd := exec.CommandContext(ctx, bin, args...)
	var errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = stdout, &errOut
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%w: %s", err, lastLines(errOut.String(), 20))
	}
	return nil
}

func deleteTopic(brokers, topic string) {
	conn, err := kgo.Dial("tcp", strings.Split(brokers, ",")[0])
	if err != nil {
		return
	}
	defer conn.Close()
	ctrl, err := conn.Controller()
	if err != nil {
		return
	}
	cc, err := kgo.Dial("tcp", net.JoinHostPort(ctrl.Host, strconv.Itoa(ctrl.Port)))
	if err != nil {
		return
	}
	defer cc.Close()
	_ = cc.DeleteTopics(topic)
}

// selfCPU is this process's user+sys CPU time in seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func randomID() string { return strconv.FormatInt(time.Now().UnixNano()%1e12, 36) }

func human(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
