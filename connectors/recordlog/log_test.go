package recordlog_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/pipeline"
	"github.com/rllm-pipe/rllm-pipe/connectors/pipeline/pipelinetest"
	"github.com/rllm-pipe/rllm-pipe/connectors/recordlog"
	"github.com/rllm-pipe/rllm-pipe/connectors/store/storetest"
	"github.com/rllm-pipe/rllm-pipe/ingest"
)

func open(t *testing.T, path string, o recordlog.Options) *recordlog.Log {
	t.Helper()
	l, err := recordlog.Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// records reads every non-blank line of the log's files, oldest first.
func records(t *testing.T, l *recordlog.Log) []string {
	t.Helper()
	var out []string
	for _, s := range l.Segments() {
		data, err := os.ReadFile(s.Path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasSuffix(data, []byte("\n")) {
			t.Fatalf("%s does not end with a whole line", s.Path)
		}
		for ln := range strings.SplitSeq(strings.TrimSuffix(string(data), "\n"), "\n") {
			if strings.TrimSpace(ln) != "" {
				out = append(out, ln)
			}
		}
	}
	return out
}

func TestGroupCommitConcurrentWriters(t *testing.T) {
	ctx := context.Background()
	l := open(t, filepath.Join(t.TempDir(), "log.jsonl"), recordlog.Options{})
	const writers, each = 32, 40
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				lines := [][]byte{fmt.Appendf(nil, `{"w":%d,"i":%d,"part":0}`, w, i), fmt.Appendf(nil, `{"w":%d,"i":%d,"part":1}`, w, i)}
				if err := l.Write(ctx, lines); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	got := records(t, l)
	if len(got) != writers*each*2 {
		t.Fatalf("%d records, want %d", len(got), writers*each*2)
	}
	seen := map[string]bool{}
	for i, r := range got {
		if seen[r] {
			t.Fatalf("record %s twice", r)
		}
		seen[r] = true
		// A Write's lines stay together, in order.
		if strings.HasSuffix(r, `"part":0}`) && (i+1 == len(got) || got[i+1] != strings.Replace(r, `"part":0`, `"part":1`, 1)) {
			t.Fatalf("the lines of one Write were split: %s then %v", r, got[min(i+1, len(got)-1)])
		}
	}
	if c := l.Commits(); c >= writers*each {
		t.Errorf("%d commits for %d writes: concurrent writes were not batched", c, writers*each)
	}
	t.Logf("%d writes in %d group commits", writers*each, l.Commits())
}

func TestTornLastLineCutOnReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "log.jsonl")
	l := open(t, path, recordlog.Options{})
	if err := l.Write(ctx, [][]byte{[]byte(`{"a":1}`), []byte(`{"a":2}`)}); err != nil {
		t.Fatal(err)
	}
	l.Close()
	// A crash in the middle of the next write: half a record, no newline.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"a":3,"half`)
	f.Close()

	l = open(t, path, recordlog.Options{})
	if err := l.Write(ctx, [][]byte{[]byte(`{"a":4}`)}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(records(t, l), " "); got != `{"a":1} {"a":2} {"a":4}` {
		t.Fatalf("after the reopen the log holds %s", got)
	}
}

func TestRefusesWhatItCannotAppend(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	foreign := filepath.Join(dir, "mine.jsonl")
	os.WriteFile(foreign, []byte(`{"not":"a log"}`+"\n"), 0o644)
	if _, err := recordlog.Open(foreign, recordlog.Options{}); err == nil {
		t.Fatal("opened a file the log did not create")
	}
	path := filepath.Join(dir, "log.jsonl")
	l := open(t, path, recordlog.Options{MaxRecordBytes: 64})
	if _, err := recordlog.Open(path, recordlog.Options{}); !errors.Is(err, recordlog.ErrLocked) {
		t.Fatalf("a second writer of the log: %v", err)
	}
	for rec, reason := range map[string]string{
		"": "blank", "  \t": "blank", "{\"a\":\n1}": "line_break", "{}\r": "line_break", strings.Repeat("x", 65): "too_large",
	} {
		err := l.Write(ctx, [][]byte{[]byte(`{"ok":1}`), []byte(rec)})
		var re *recordlog.RecordError
		if !errors.Is(err, recordlog.ErrRecord) || !errors.As(err, &re) || re.Index != 1 || re.Reason != reason {
			t.Errorf("record %q: %v, want record 1 refused as %s", rec, err, reason)
		}
	}
	if n := len(records(t, l)); n != 0 {
		t.Fatalf("a refused Write left %d records", n)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := l.Write(cancelled, [][]byte{[]byte(`{}`)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a Write with its ctx done: %v", err)
	}
	l.Close()
	if err := l.Write(ctx, [][]byte{[]byte(`{}`)}); !errors.Is(err, recordlog.ErrClosed) {
		t.Fatalf("a Write after Close: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestStreamIdentityFixedFromCreation: `ingest --from` names a file by its
// path and its first 64 KiB, which the header fills, so a log read short
// and read again grown is one stream; a new log at the same path is not.
func TestStreamIdentityFixedFromCreation(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "log.jsonl")
	stream := func() string {
		src, err := ingest.OpenFile(path, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		return src.Stream()
	}
	l := open(t, path, recordlog.Options{})
	l.Write(ctx, [][]byte{[]byte(`{"a":1}`)})
	short := stream()
	l.Write(ctx, [][]byte{bytes.Repeat([]byte("x"), 100<<10)})
	if grown := stream(); grown != short {
		t.Fatalf("the stream changed as the log grew: %s then %s", short, grown)
	}
	l.Close()
	os.Remove(path)
	open(t, path, recordlog.Options{})
	if again := stream(); again == short {
		t.Fatal("a new log at the same path has the old one's stream: a rerun would skip its records")
	}
}

func TestRotationAndTail(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	path := filepath.Join(t.TempDir(), "wal.jsonl")
	l := open(t, path, recordlog.Options{MaxFileBytes: recordlog.HeaderSize + 1000})
	var segs []recordlog.Segment
	tail := l.Tail(func(_ context.Context, s recordlog.Segment) error { segs = append(segs, s); return nil })
	defer tail.Close()
	const n = 200
	go func() {
		for i := range n {
			if err := l.Write(ctx, [][]byte{fmt.Appendf(nil, `{"i":%03d,"pad":"%s"}`, i, strings.Repeat("p", 40))}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var got []ingest.Raw
	for len(got) < n {
		c, err := tail.Read(ctx)
		if err != nil {
			t.Fatalf("after %d records: %v", len(got), err)
		}
		got = append(got, c.Records...)
	}
	lines := map[string]int64{}
	for i, r := range got {
		if want := fmt.Sprintf(`{"i":%03d,`, i); !strings.HasPrefix(string(r.Data), want) {
			t.Fatalf("record %d is %s", i, r.Data)
		}
		if r.Source.Line <= lines[r.Source.Stream] || r.Source.Line <= recordlog.HeaderLines {
			t.Fatalf("record %d at line %d of %s", i, r.Source.Line, r.Source.Stream)
		}
		lines[r.Source.Stream] = r.Source.Line
	}
	all := l.Segments()
	if len(all) < 5 || len(segs) != len(all) || len(lines) != len(all) {
		t.Fatalf("%d segments, %d tailed, %d streams", len(all), len(segs), len(lines))
	}
	// Each segment is an ordinary input with the tail's positions.
	src, err := ingest.OpenFile(all[1].Path, 0)
	if err != nil {
		t.Fatal(err)
	}
	c, err := src.Read(ctx)
	c.Split()
	src.Close()
	if err != nil || c.Blank != recordlog.HeaderLines || len(c.Records) == 0 || c.Records[0].Source.Line != recordlog.HeaderLines+1 {
		t.Fatalf("segment read by ingest: %v, %d blank, %d records", err, c.Blank, len(c.Records))
	}
	passed := tail.Passed()
	if len(passed) != len(all)-1 || passed[0].Last != lines[passed[0].Stream] {
		t.Fatalf("passed %+v", passed)
	}
	if err := l.Remove(all[len(all)-1].N); err == nil {
		t.Fatal("removed the segment being written")
	}
	if err := l.Remove(all[0].N); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(all[0].Path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("segment still there: %v", err)
	}
	// Caught up, the tail waits for more until its ctx ends.
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	if _, err := tail.Read(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read at the end: %v", err)
	}
	l.Close()
	// Reopened, the log goes on with the last segment.
	l2 := open(t, path, recordlog.Options{MaxFileBytes: recordlog.HeaderSize + 1000})
	if got := len(l2.Segments()); got != len(all)-1 {
		t.Fatalf("reopened with %d segments, want %d", got, len(all)-1)
	}
}

// TestIngestRerunExactlyOnce: `rllm-pipe ingest --from` over the log, run
// again after it grew, commits every record once.
func TestIngestRerunExactlyOnce(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "traces.jsonl")
	root := filepath.Join(dir, "data")
	l := open(t, path, recordlog.Options{})
	write := func(from, to int) {
		for g := from; g < to; g++ {
			var lines [][]byte
			for _, s := range pipelinetest.GroupLines(g) {
				lines = append(lines, []byte(s))
			}
			if err := l.Write(ctx, lines); err != nil {
				t.Fatal(err)
			}
		}
	}
	ingestRun := func(writer string) pipeline.Result {
		st, err := local.Open(root, writer)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		src, err := ingest.OpenFile(path, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		p := pipeline.New(pipelinetest.Config(t), st, nil)
		if err := p.Run(ctx, ctx, src, src.Stream()); err != nil {
			t.Fatal(err)
		}
		return p.Result()
	}
	write(0, 5)
	if r := ingestRun("run-1"); r.GroupsEmitted != 5 {
		t.Fatalf("first run: %+v", r)
	}
	write(5, 12)
	if r := ingestRun("run-2"); r.GroupsEmitted != 7 || r.SkippedCommitted != 20 {
		t.Fatalf("rerun over the grown log: %+v", r)
	}
	rd, err := local.OpenReader(root)
	if err != nil {
		t.Fatal(err)
	}
	counts := storetest.StepCounts(t, rd)
	if len(counts) != 24 {
		t.Fatalf("%d steps committed, want 24", len(counts))
	}
	for id, n := range counts {
		if n != 1 {
			t.Errorf("step %s committed %d times", id, n)
		}
	}
}
