package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/kafka"
	"github.com/rllm-pipe/rllm-pipe/connectors/s3"
)

// benchEnv is integrationEnv for benchmarks.
func benchEnv(b *testing.B) (string, string) {
	brokers, endpoint := os.Getenv("RLLM_PIPE_KAFKA_BROKERS"), os.Getenv("RLLM_PIPE_S3_ENDPOINT")
	if brokers == "" || endpoint == "" {
		b.Skip("RLLM_PIPE_KAFKA_BROKERS / RLLM_PIPE_S3_ENDPOINT not set: run `make bench` (it starts Kafka and MinIO)")
	}
	return brokers, endpoint
}

func benchID() string {
	var rb [4]byte
	rand.Read(rb[:])
	return hex.EncodeToString(rb[:])
}

func benchBinary(b *testing.B) string {
	bin := filepath.Join(b.TempDir(), "rllm-pipe")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/rllm-pipe")
	wd, _ := os.Getwd()
	cmd.Dir = filepath.Join(wd, "..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// Kafka→MinIO throughput is measured by cmd/kafkabench (make
// bench-kafka): warm, alternating with a bare kafka-go drain and the file
// ingest of the same input, median and spread of several rounds. A
// single cold run next to a single drain, as a benchmark here did, swung
// from a fifth to more than the drain between runs.

// BenchmarkIntegrationCommitDelay produces 1,000 steps/s (groups of 4
// one-step trajectories) for 20 s while ingest runs with a 1 s flush
// interval, and reports the delay from a group's last record produced to
// the manifest entry that commits its shard: p50 and p99.
func BenchmarkIntegrationCommitDelay(b *testing.B) {
	brokers, endpoint := benchEnv(b)
	bin := benchBinary(b)
	for b.Loop() {
		id := benchID()
		topic, prefix := "delay-"+id, "delay-"+id
		kcfg, _ := kafka.ParseURL("kafka://" + brokers + "/" + topic)
		if err := kafka.EnsureTopic(context.Background(), kcfg, 4, 1); err != nil {
			b.Fatal(err)
		}
		cfg, _ := s3.ParseURL("s3://rllm-pipe-bench/" + prefix)
		cfg.Endpoint = endpoint
		c := exec.Command(bin, "ingest", "--from", "kafka://"+brokers+"/"+topic+"?group=g-"+id, "--to", "s3://rllm-pipe-bench/"+prefix,
			"--group-size", "4", "--flush-interval", "1s", "--quiet")
		c.Env = serviceEnv()
		if err := c.Start(); err != nil {
			b.Fatal(err)
		}
		time.Sleep(8 * time.Second) // let the consumer join
		p, err := kafka.NewProducer(kcfg)
		if err != nil {
			b.Fatal(err)
		}
		lastProduced := map[string]time.Time{}
		const groups, rate = 5000, 1000 // 4 steps per group → 20 s at 1,000 steps/s
		tick := time.NewTicker(4 * time.Millisecond)
		for g := 0; g < groups; g++ {
			<-tick.C
			key := fmt.Sprintf("task-%s-%d", id, g)
			var recs [][]byte
			for tr := 0; tr < 4; tr++ {
				tid := fmt.Sprintf("%s/%d", key, tr)
				recs = append(recs,
					[]byte(fmt.Sprintf(`{"type":"step","step_id":"%s#0","task_id":"%s","trajectory_id":"%s","step_index":0,"policy_version":1,"prompt_ids":[1,2,3],"response_ids":[4,5],"response_logprobs":[-0.5,-0.25]}`, tid, key, tid)),
					[]byte(fmt.Sprintf(`{"type":"trajectory","trajectory_id":"%s","task_id":"%s","reward":%d,"num_steps":1}`, tid, key, tr%2)))
			}
			if err := p.Send(context.Background(), recs...); err != nil {
				b.Fatal(err)
			}
			lastProduced[key] = time.Now()
		}
		tick.Stop()
		p.Close()
		// Follow the manifest until every group is committed.
		committedAt := map[string]time.Time{}
		st, err := s3.Open(context.Background(), cfg, "observer")
		if err != nil {
			b.Fatal(err)
		}
		seen := 0
		for deadline := time.Now().Add(2 * time.Minute); len(committedAt) < groups && time.Now().Before(deadline); {
			if err := st.Refresh(context.Background()); err != nil {
				b.Fatal(err)
			}
			entries := mustEntries(b, st)
			for _, e := range entries[seen:] {
				for _, k := range e.GroupKeys {
					if _, ok := committedAt[k]; !ok {
						committedAt[k] = e.CommittedAt
					}
				}
			}
			seen = len(entries)
			time.Sleep(50 * time.Millisecond)
		}
		c.Process.Signal(syscall.SIGTERM)
		c.Wait()
		if len(committedAt) < groups {
			b.Fatalf("%d of %d groups committed", len(committedAt), groups)
		}
		var delays []float64
		for k, t := range lastProduced {
			delays = append(delays, committedAt[k].Sub(t).Seconds())
		}
		sort.Float64s(delays)
		b.ReportMetric(delays[len(delays)/2], "p50-s")
		b.ReportMetric(delays[len(delays)*99/100], "p99-s")
		b.ReportMetric(float64(rate), "steps/s-offered")
	}
}
