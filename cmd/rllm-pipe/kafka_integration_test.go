package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/rllm-pipe/rllm-pipe/connectors/s3"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// integrationEnv returns the services `make test` started, or skips.
func integrationEnv(t *testing.T) (brokers, s3Endpoint string) {
	t.Helper()
	brokers, s3Endpoint = os.Getenv("RLLM_PIPE_KAFKA_BROKERS"), os.Getenv("RLLM_PIPE_S3_ENDPOINT")
	if brokers == "" || s3Endpoint == "" {
		t.Skip("RLLM_PIPE_KAFKA_BROKERS / RLLM_PIPE_S3_ENDPOINT not set: run `make test` (it starts Kafka and MinIO)")
	}
	return brokers, s3Endpoint
}

// serviceEnv is the environment for child processes: credentials and
// endpoint of the test MinIO, no RLLM_* flag defaults.
func serviceEnv() []string {
	env := e2eEnv()
	for _, k := range []string{"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"} {
		if v := os.Getenv(k); v != "" {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// TestIntegrationKafkaToS3CrashLoop produces 100k steps (and bad records)
// to a real Kafka topic, runs ingest into a real MinIO and kills it with
// SIGKILL at random moments, at least ten times, restarting it each time;
// in the end every step is committed exactly once (read back with DuckDB)
// and every bad record is dead-lettered exactly once.
func TestIntegrationKafkaToS3CrashLoop(t *testing.T) {
	t.Parallel() // see main_test.go
	sc := newScenario(t, "crash", "--groups", "3000", "--duplicates", "0.01", "--seed", "5")
	var lines [][]byte
	for i, l := range sc.lines {
		lines = append(lines, l)
		if i%300 == 150 {
			lines = append(lines, []byte(fmt.Sprintf(`{"type":"step","step_id":"bad-%d","task_id":`, i)))
		}
	}
	sc.setLines(lines)
	ref := sc.reference(lines)
	if len(ref.Rows) < 25_000 {
		t.Fatalf("only %d steps generated", len(ref.Rows))
	}
	// Produce in 12 slices with pauses, while ingest is being killed and
	// restarted, so that kills land mid-stream.
	produced := make(chan error, 1)
	go func() {
		const slices = 12
		for k := 0; k < slices; k++ {
			lo, hi := k*len(lines)/slices, (k+1)*len(lines)/slices
			if err := sc.produce(lines[lo:hi], fmt.Sprintf("part-%d.jsonl", k), 6); err != nil {
				produced <- err
				return
			}
			time.Sleep(time.Second)
		}
		produced <- nil
	}()

	cfg := sc.cfg
	newIngest := func() *exec.Cmd { return sc.ingest("--shard-size", "512KiB", "--quiet") }
	settledAll := func() int64 { return settledCount(t, cfg) }
	rng := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 2))
	kills, wantKills := 0, 4
	if longTier() {
		wantKills = 10
	}
	produceDone := false
	for kills < wantKills || !produceDone {
		select {
		case err := <-produced:
			if err != nil {
				t.Fatal(err)
			}
			produceDone = true
		default:
		}
		c := newIngest()
		var stderr syncBuffer
		c.Stderr = &stderr
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill while it commits: once it has settled something new (or
		// after 15 s), after a random extra moment.
		before := settledAll()
		for wait := time.Now(); time.Since(wait) < 15*time.Second && settledAll() == before && before < int64(len(lines)); {
			time.Sleep(100 * time.Millisecond)
		}
		time.Sleep(time.Duration(rng.IntN(1000)) * time.Millisecond)
		c.Process.Kill()
		c.Wait()
		kills++
		t.Logf("kill %d: %d positions settled", kills, settledAll())
	}
	// The last run goes on until every record is settled, then stops
	// gracefully (SIGTERM).
	c := newIngest()
	var stderr syncBuffer
	c.Stderr = &stderr
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(4 * time.Minute)
	for settledAll() < int64(len(lines)) {
		if time.Now().After(deadline) {
			c.Process.Kill()
			c.Wait()
			t.Fatalf("not every record settled after 4 minutes (%d of %d)\n%s", settledAll(), len(lines), stderr.String())
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err := terminate(t, c, waitChan(c), &stderr); err != nil {
		t.Fatalf("final ingest: %v\n%s", err, stderr.String())
	}

	shards, letters := verifyS3Output(t, cfg, ref, sc.work, true)
	t.Logf("%d kills; %d steps exactly once in %d shards; %d dead letters", kills, len(ref.Rows), shards, letters)
}

// verifyS3Output reads the committed data under cfg (listed by the
// manifest) with DuckDB and checks it against the reference: every valid
// step exactly once with its advantage, every bad record dead-lettered
// exactly once. It returns the number of shards and dead letters.
func verifyS3Output(t *testing.T, cfg s3.Config, ref *refResult, work string, dlqObjects bool) (int, int) {
	t.Helper()
	// Read back: shards listed by the manifest, downloaded, through DuckDB.
	st, err := s3.Open(context.Background(), cfg, "reader")
	if err != nil {
		t.Fatal(err)
	}
	cli, bucket := st.Client()
	local := filepath.Join(work, "shards")
	var paths, dlq []string
	for _, e := range mustEntries(t, st) {
		if e.Path != "" {
			p := filepath.Join(local, filepath.FromSlash(e.Path))
			if err := cli.FGetObject(context.Background(), bucket, st.Key(e.Path), p, minio.GetObjectOptions{}); err != nil {
				t.Fatal(err)
			}
			paths = append(paths, p)
		}
		if e.DeadLetters != nil {
			dlq = append(dlq, e.DeadLetters.File)
		}
	}
	checkStepsExactlyOnce(t, paths, ref)
	letters := 0
	byRecord := map[string]int{}
	for _, key := range dlq {
		obj, err := cli.GetObject(context.Background(), bucket, st.Key(key), minio.GetObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(obj)
		obj.Close()
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			var l schemas.DeadLetterLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				t.Fatal(err)
			}
			letters++
			byRecord[l.Record]++
		}
	}
	if dlqObjects && letters != len(ref.DeadLetters) {
		t.Errorf("%d dead letters, want %d", letters, len(ref.DeadLetters))
	}
	for rec, n := range byRecord {
		if n != 1 {
			t.Errorf("dead letter %q appears %d times", e2eClip(rec, 80), n)
		}
	}
	return len(paths), letters
}
