package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	kgo "github.com/segmentio/kafka-go"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// TestIntegrationDeadLetterTopic sends bad records of many kinds through a
// real topic: each reaches the dead-letter topic with its reason, and the
// good records beside them are committed exactly once (the partitions
// never stall).
func TestIntegrationDeadLetterTopic(t *testing.T) {
	sc := newScenario(t, "dlq", "--groups", "300", "--seed", "3")
	brokers, topic := sc.brokers, sc.topic
	bad := [][]byte{
		[]byte(`{"type":"step","step_id":`),
		[]byte(`[1,2,3]`),
		[]byte(`{"type":"episode","task_id":"x"}`),
		[]byte(`{"type":"trajectory","trajectory_id":"t","task_id":"x","reward":NaN,"num_steps":1}`),
		[]byte(`{"type":"step","step_id":"s","task_id":"x","trajectory_id":"t","step_index":0,"policy_version":0,"prompt_ids":[1],"response_ids":[1,2],"response_logprobs":[-1]}`),
		[]byte(`{"type":"step","step_id":"s2","task_id":"x","trajectory_id":"t2","step_index":0,"policy_version":0,"prompt_ids":[-1],"response_ids":[],"response_logprobs":[]}`),
		[]byte("{\"type\":\"step\",\"step_id\":\"\xff\""),
	}
	var lines [][]byte
	for i, l := range sc.lines {
		lines = append(lines, l)
		if i%150 == 7 {
			lines = append(lines, bad[(i/150)%len(bad)])
		}
	}
	sc.setLines(lines)
	ref := sc.reference(lines)
	if err := sc.produce(lines, "all.jsonl", 3); err != nil {
		t.Fatal(err)
	}
	cfg := sc.cfg
	dlqTopic := topic + ".dlq"
	c := sc.ingest("--dlq", "kafka://"+brokers+"/"+dlqTopic, "--quiet")
	var stderr syncBuffer
	c.Stderr = &stderr
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Minute); settledCount(t, cfg) < int64(len(lines)); time.Sleep(300 * time.Millisecond) {
		if time.Now().After(deadline) {
			c.Process.Kill()
			t.Fatalf("%d of %d settled\n%s", settledCount(t, cfg), len(lines), stderr.String())
		}
	}
	if err := terminate(t, c, waitChan(c), &stderr); err != nil {
		t.Fatalf("ingest: %v\n%s", err, stderr.String())
	}
	verifyS3Output(t, cfg, ref, sc.work, false)

	// The dead-letter topic holds each bad record once, with its reason.
	want := map[string]string{} // record → reason
	left := map[string]int{}    // record → letters still expected
	for _, d := range ref.DeadLetters {
		want[string(d.Raw)] = d.Reason
		left[string(d.Raw)]++
	}
	for _, l := range readDeadLetterTopic(t, brokers, dlqTopic, len(ref.DeadLetters)) {
		reason, ok := want[l.raw]
		if !ok || left[l.raw] == 0 {
			t.Fatalf("unexpected (or repeated) dead letter %s", l.value)
		}
		left[l.raw]--
		if string(l.Reason) != reason || l.Source.Topic != topic || !strings.HasPrefix(l.key, topic+"/") {
			t.Errorf("dead letter %s: reason %s (want %s), key %s", e2eClip(l.raw, 60), l.Reason, reason, l.key)
		}
	}
	t.Logf("%d dead letters on %s; %d steps committed", len(ref.DeadLetters), dlqTopic, len(ref.Rows))
}

// topicLetter is a message of a dead-letter topic, decoded.
type topicLetter struct {
	schemas.DeadLetterLine
	raw, key, value string // raw: the record, base64 undone
}

// readDeadLetterTopic reads the n letters of partition 0 of a dead-letter
// topic and checks that no more follow.
func readDeadLetterTopic(t *testing.T, brokers, topic string, n int) []topicLetter {
	t.Helper()
	r := kgo.NewReader(kgo.ReaderConfig{Brokers: strings.Split(brokers, ","), Topic: topic, Partition: 0, MaxWait: 200 * time.Millisecond})
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []topicLetter
	for len(out) < n {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("read dead-letter topic after %d of %d: %v", len(out), n, err)
		}
		l := topicLetter{key: string(m.Key), value: string(m.Value)}
		if err := json.Unmarshal(m.Value, &l.DeadLetterLine); err != nil {
			t.Fatal(err)
		}
		l.raw = l.Record
		if l.RecordEncoding == "base64" {
			l.raw = string(mustBase64(t, l.Record))
		}
		out = append(out, l)
	}
	more, cancelMore := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelMore()
	if m, err := r.ReadMessage(more); err == nil {
		t.Errorf("a dead letter more than the %d expected: %s", n, m.Value)
	}
	return out
}

func mustBase64(t *testing.T, s string) []byte {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestIntegrationKafkaHeldDeadLetters: records an ingest held while their
// group was open, then dead-lettered when the group timed out incomplete,
// reach the dead-letter topic byte for byte. The ingest holds a Kafka
// record by its partition and offset, not its bytes, and fetches the
// letters' records again before writing them; the good groups beside them
// are committed.
func TestIntegrationKafkaHeldDeadLetters(t *testing.T) {
	sc := newScenario(t, "held", "--groups", "40", "--seed", "5")
	// Two groups that never complete (group size 4): one trajectory each
	// complete, one missing its last step. Multi-turn: each step's prompt
	// extends the one before, as an agent's do.
	var held [][]byte
	for g := range 2 {
		task := fmt.Sprintf("held-%d", g)
		for r := range 2 {
			id := fmt.Sprintf("%s/r%d", task, r)
			prompt := fmt.Sprintf("%d,%d,%d", 100+g, 200+r, 300)
			steps := 3 - r // r1 sends 2 of its 3 steps
			for i := range steps {
				held = append(held, fmt.Appendf(nil, `{"type":"step","step_id":"%s#%d","task_id":"%s","trajectory_id":"%s","step_index":%d,"policy_version":0,"prompt_ids":[%s],"response_ids":[7,%d],"response_logprobs":[-0.5,-0.25]}`,
					id, i, task, id, i, prompt, i))
				prompt += fmt.Sprintf(",7,%d,9", i)
			}
			held = append(held, fmt.Appendf(nil, `{"type":"trajectory","trajectory_id":"%s","task_id":"%s","reward":%d,"num_steps":3}`, id, task, r))
		}
	}
	lines := slices.Clone(sc.lines)
	for i, h := range held { // spread among the good records
		at := (i*len(lines))/len(held) + 1
		lines = slices.Insert(lines, at, h)
	}
	sc.setLines(lines)
	if err := sc.produce(lines, "all.jsonl", 2); err != nil {
		t.Fatal(err)
	}
	dlqTopic := sc.topic + ".dlq"
	c := sc.ingest("--dlq", "kafka://"+sc.brokers+"/"+dlqTopic, "--group-timeout", "4s", "--min-group-size", "3", "--quiet")
	var stderr syncBuffer
	c.Stderr = &stderr
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Minute); settledCount(t, sc.cfg) < int64(len(lines)); time.Sleep(300 * time.Millisecond) {
		if time.Now().After(deadline) {
			c.Process.Kill()
			t.Fatalf("%d of %d settled\n%s", settledCount(t, sc.cfg), len(lines), stderr.String())
		}
	}
	if err := terminate(t, c, waitChan(c), &stderr); err != nil {
		t.Fatalf("ingest: %v\n%s", err, stderr.String())
	}

	left := map[string]int{}
	for _, h := range held {
		left[string(h)]++
	}
	for _, l := range readDeadLetterTopic(t, sc.brokers, dlqTopic, len(held)) {
		if left[l.raw] == 0 {
			t.Fatalf("unexpected (or repeated) dead letter %s", l.value)
		}
		left[l.raw]--
		if l.Reason != schemas.ReasonIncompleteGroup || l.Source.Topic != sc.topic {
			t.Errorf("dead letter %s: reason %s, topic %s", e2eClip(l.raw, 60), l.Reason, l.Source.Topic)
		}
	}
}
