package pipeline

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// TestSpoolSpillsWhatIsNotSettled: the spool numbers lines as the decode
// stage does (chunk-relative, blank lines counted), drops segments whose
// records are all settled, and spills exactly the lines not settled, as
// they were read.
func TestSpoolSpillsWhatIsNotSettled(t *testing.T) {
	defer func(n int64) { spoolSegment = n }(spoolSegment)
	spoolSegment = 40 // a new segment every few lines
	dir := t.TempDir()
	spill := filepath.Join(dir, "spill.jsonl")
	sp, err := newSpool(spill, "stdin:run")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	line := 0
	for c := range 6 {
		var ch ingest.Chunk
		for i := range 5 {
			ch.Lines++
			line++
			if (c+i)%4 == 3 {
				ch.Blank++
				lines = append(lines, "")
				continue
			}
			data := strings.Repeat("x", i) + "-" + string(rune('a'+c))
			ch.Records = append(ch.Records, ingest.Raw{Data: []byte(data), Source: schemas.Source{File: "-", Line: ch.Lines}})
			lines = append(lines, data)
		}
		sp.keep(&ch)
		for _, r := range ch.Records {
			if r.Source.Stream != "stdin:run" {
				t.Fatalf("record's stream %q", r.Source.Stream)
			}
		}
		// Settle every record of the first three chunks, and line 19.
		if c < 3 {
			st := schemas.Settled{}
			for i := c*5 + 1; i <= c*5+5; i++ {
				st.Add("stdin:run", int64(i))
			}
			sp.settle(st)
		}
	}
	sp.settle(schemas.Settled{"stdin:run": {{19, 19}}})
	if len(sp.segs) >= 6 {
		t.Errorf("%d segments kept: settled ones were not dropped", len(sp.segs))
	}
	n, err := sp.finish()
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i, l := range lines {
		if l != "" && i+1 > 15 && i+1 != 19 {
			want = append(want, l)
		}
	}
	got, err := os.ReadFile(spill)
	if err != nil {
		t.Fatal(err)
	}
	if int(n) != len(want) || string(got) != strings.Join(want, "\n")+"\n" {
		t.Fatalf("spilled %d:\n%s\nwant %d:\n%s", n, got, len(want), strings.Join(want, "\n"))
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*")); len(left) > 0 {
		t.Errorf("segments left: %v", left)
	}
}

// TestSpoolNothingToSpill: when everything is settled no spill file is
// made.
func TestSpoolNothingToSpill(t *testing.T) {
	dir := t.TempDir()
	sp, err := newSpool(filepath.Join(dir, "spill.jsonl"), "s")
	if err != nil {
		t.Fatal(err)
	}
	sp.keep(&ingest.Chunk{Lines: 2, Records: []ingest.Raw{{Data: []byte("a"), Source: schemas.Source{Line: 1}}, {Data: []byte("b"), Source: schemas.Source{Line: 2}}}})
	sp.settle(schemas.Settled{"s": {{1, 2}}})
	if n, err := sp.finish(); n != 0 || err != nil {
		t.Fatalf("finish: %d, %v", n, err)
	}
	if left, _ := os.ReadDir(dir); len(left) > 0 {
		t.Fatalf("files left: %v", left)
	}
}
