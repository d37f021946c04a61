//go:build unix

package local

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/connectors/store/storetest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// killChildEnv carries a child's settings into the re-entered test binary.
const killChildEnv = "RLLM_LOCAL_KILL_CHILD"

// The positions of stream "f": 1..4 are the dead writer's history,
// killFirst..killLast the killed writer's, every third of them a dead
// letter instead of a shard.
const (
	killFirst = 5
	killLast  = 16
)

func deadLettered(i int) bool { return i%3 == 0 }

// killChildSpec is what one child does: open Root as w1, commit or
// dead-letter positions killFirst..killLast that are not settled, close,
// and SIGKILL itself before step At of the store's protocol (0: never;
// it prints every step's name).
type killChildSpec struct {
	Root string
	At   int
}

func runKillChild(spec string) error {
	var c killChildSpec
	if err := json.Unmarshal([]byte(spec), &c); err != nil {
		return err
	}
	out := bufio.NewWriter(os.Stdout)
	say := func(format string, args ...any) {
		fmt.Fprintf(out, format+"\n", args...)
		out.Flush()
	}
	n := 0
	crashPoint = func(name string) {
		n++
		say("step %d %s", n, name)
		if n == c.At {
			storetest.Die()
		}
	}
	stateEvery = 3
	return writePositions(c.Root, "w1", killFirst, killLast, func(i int) { say("acked %d", i) })
}

// writePositions opens root as writer and commits positions lo..hi of
// stream f that are not settled yet, as a shard each or, for every third,
// a dead letter; acked runs after each commit returned.
func writePositions(root, writer string, lo, hi int, acked func(int)) error {
	ctx := context.Background()
	s, err := Open(root, writer)
	if err != nil {
		return err
	}
	settled := s.Settled()["f"]
	for i := lo; i <= hi; i++ {
		if settled.Contains(int64(i)) {
			continue
		}
		if deadLettered(i) {
			dl := s.DeadLetters()
			letter := schemas.DeadLetter{Reason: schemas.Reason("bad_json"), Error: "test", Source: schemas.Source{Stream: "f", File: "in.jsonl", Line: int64(i)}, Record: []byte(strconv.Itoa(i))}
			if err := dl.Write(ctx, []schemas.DeadLetter{letter}, nil); err != nil {
				return err
			}
			st, state, err := dl.Checkpoint(ctx)
			if err != nil {
				return err
			}
			if err := s.Append(ctx, schemas.ShardEntry{Settled: st, DeadLetters: state}); err != nil {
				return err
			}
		} else {
			p, err := s.Create(ctx, fmt.Sprintf("policy=0/part-%s-%06d.parquet", writer, i))
			if err != nil {
				return err
			}
			fmt.Fprintf(p, "shard %d", i)
			if err := p.Commit(ctx, schemas.ShardEntry{Rows: 1, Settled: schemas.Settled{"f": {{int64(i), int64(i)}}}}); err != nil {
				return err
			}
		}
		acked(i)
	}
	return s.Close()
}

// A writer of a local root is killed with SIGKILL before every step of
// the store's protocol that changes the root: publishing a shard,
// appending to the manifest, writing and replacing the writer state,
// registering, removing a dead writer's temporary files and orphans,
// cutting and writing dead letters. The root it leaves is checked
// (killedRootIsSound), then a second writer resumes it and every
// position is settled exactly once, by one shard or one dead letter.
func TestWriterKilledAtEveryStep(t *testing.T) {
	if spec := os.Getenv(killChildEnv); spec != "" {
		if err := runKillChild(spec); err != nil {
			t.Fatal(err)
		}
		return
	}
	run := func(root string, at int) (acked []int, steps []string, killed bool) {
		t.Helper()
		spec, _ := json.Marshal(killChildSpec{Root: root, At: at})
		lines, killed := storetest.Reenter(t, "TestWriterKilledAtEveryStep", killChildEnv, string(spec))
		for _, line := range lines {
			if v, ok := strings.CutPrefix(line, "step "); ok {
				_, name, _ := strings.Cut(v, " ")
				steps = append(steps, name)
			}
		}
		return storetest.Acked(lines), steps, killed
	}
	acked, steps, killed := run(deadWriterRoot(t), 0)
	if killed || len(acked) != killLast-killFirst+1 {
		t.Fatalf("the run without a kill acknowledged %v (killed %v)", acked, killed)
	}
	kinds := map[string]int{}
	for _, s := range steps {
		kinds[s]++
	}
	for _, want := range []string{"publish shard", "append manifest", "write state", "replace state", "append writers", "remove orphan", "remove temporary", "cut dead letters", "write dead letters"} {
		if kinds[want] == 0 {
			t.Fatalf("the writer never took step %q: %v", want, kinds)
		}
	}
	t.Logf("a writer takes %d steps (%v); killing it before each", len(steps), kinds)
	for at := 1; at <= len(steps); at++ {
		root := deadWriterRoot(t)
		acked, _, killed := run(root, at)
		if !killed {
			t.Fatalf("step %d (%s): the writer was not killed", at, steps[at-1])
		}
		killedRootIsSound(t, root, fmt.Sprintf("killed before step %d (%s)", at, steps[at-1]), acked)
	}
}

// deadWriterRoot returns a root whose writer w0 settled positions 1..4
// (3 by a dead letter) and died, leaving an unlisted shard, a temporary
// file and a dead letter beyond the durable length.
func deadWriterRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	ctx := context.Background()
	w0, err := Open(root, "w0")
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 4; i++ {
		if deadLettered(i) {
			dl := w0.DeadLetters()
			if err := dl.Write(ctx, []schemas.DeadLetter{{Reason: "bad_json", Source: schemas.Source{Stream: "f", File: "in.jsonl", Line: int64(i)}, Record: []byte("x")}}, nil); err != nil {
				t.Fatal(err)
			}
			st, state, err := dl.Checkpoint(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := w0.Append(ctx, schemas.ShardEntry{Settled: st, DeadLetters: state}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		p, _ := w0.Create(ctx, fmt.Sprintf("policy=0/part-w0-%06d.parquet", i))
		fmt.Fprintf(p, "shard %d", i)
		if err := p.Commit(ctx, schemas.ShardEntry{Rows: 1, Settled: schemas.Settled{"f": {{int64(i), int64(i)}}}}); err != nil {
			t.Fatal(err)
		}
	}
	// Written but never made durable by an entry: cut by the next writer.
	if err := w0.DeadLetters().Write(ctx, []schemas.DeadLetter{{Reason: "bad_json", Source: schemas.Source{Stream: "f", File: "in.jsonl", Line: 5}, Record: []byte("x")}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := w0.dl.Flush(); err != nil {
		t.Fatal(err)
	}
	p, _ := w0.Create(ctx, "policy=0/part-w0-000099.parquet") // its temporary file stays
	p.Write([]byte("never published"))
	if err := os.WriteFile(filepath.Join(root, "policy=0", "part-w0-000098.parquet"), []byte("published, never listed"), 0o644); err != nil {
		t.Fatal(err)
	}
	Crash(w0)
	return root
}

// killedRootIsSound checks the root a killed writer left: each position
// is settled at most once, every acknowledged one is, the writer state
// agrees with a full read of the manifest; then a second writer resumes
// and every position 1..killLast is settled exactly once, with no file
// left that the manifest does not list.
func killedRootIsSound(t *testing.T, root, step string, acked []int) {
	t.Helper()
	entries, err := ReadManifest(root)
	if err != nil {
		t.Fatalf("%s: the manifest: %v", step, err)
	}
	count := map[int64]int{}
	for _, e := range entries {
		for _, r := range e.Settled["f"] {
			for i := r[0]; i <= r[1]; i++ {
				count[i]++
			}
		}
	}
	for i, n := range count {
		if n > 1 {
			t.Fatalf("%s: position %d settled %d times", step, i, n)
		}
	}
	for _, i := range acked {
		if count[int64(i)] != 1 {
			t.Fatalf("%s: acknowledged position %d is not settled", step, i)
		}
	}
	// The writer state (if any) and a full read of the manifest agree:
	// open two copies, one without the state.
	settledOf := func(dropState bool) schemas.Settled {
		dir := t.TempDir()
		if err := os.CopyFS(dir, os.DirFS(root)); err != nil {
			t.Fatal(err)
		}
		if dropState {
			if err := os.Remove(filepath.Join(dir, ManifestDir, StateFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
		}
		c, err := Open(dir, "check")
		if err != nil {
			t.Fatalf("%s: open a copy (without the state: %v): %v", step, dropState, err)
		}
		defer c.Close()
		return c.Settled()
	}
	if a, b := settledOf(false), settledOf(true); !slices.Equal(a["f"], b["f"]) {
		t.Fatalf("%s: settled from the writer state %v, from the whole manifest %v", step, a, b)
	}
	// Readers starting at the state's marks read what a whole read does.
	committedFromEveryShard(t, root)
	if err := writePositions(root, "w2", 1, killLast, func(int) {}); err != nil {
		t.Fatalf("%s: resume: %v", step, err)
	}
	w3, err := Open(root, "w3")
	if err != nil {
		t.Fatal(err)
	}
	if got := w3.Settled()["f"]; len(got) != 1 || got[0] != [2]int64{1, killLast} {
		t.Fatalf("%s: after the resume positions %v are settled, want 1..%d", step, got, killLast)
	}
	w3.Close()
	// Each position once: by one listed shard or one durable dead letter,
	// and no shard file or dead letter that the manifest does not list.
	entries, _ = ReadManifest(root)
	by := map[int]int{}
	listed := map[string]bool{}
	for _, e := range entries {
		if e.Path != "" {
			listed[e.Path] = true
			if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(e.Path))); err != nil {
				t.Fatalf("%s: listed shard %s: %v", step, e.Path, err)
			}
			i, _ := strconv.Atoi(strings.TrimSuffix(e.Path[strings.LastIndexByte(e.Path, '-')+1:], ".parquet"))
			by[i]++
		}
	}
	files, _ := filepath.Glob(filepath.Join(root, "policy=0", "*"))
	for _, f := range files {
		if rel := "policy=0/" + filepath.Base(f); !listed[rel] {
			t.Fatalf("%s: %s is not listed but still there", step, rel)
		}
	}
	dlq, _ := filepath.Glob(filepath.Join(root, DLQDir, "*.jsonl"))
	for _, f := range dlq {
		data, _ := os.ReadFile(f)
		for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
			if len(line) == 0 {
				continue
			}
			var l schemas.DeadLetterLine
			if err := json.Unmarshal(line, &l); err != nil {
				t.Fatalf("%s: %s: %v", step, f, err)
			}
			by[int(l.Source.Line)]++
		}
	}
	for i := 1; i <= killLast; i++ {
		if by[i] != 1 {
			t.Fatalf("%s: position %d is in %d shards and dead letters, want 1 (%v)", step, i, by[i], by)
		}
	}
	if tmp, _ := os.ReadDir(filepath.Join(root, TmpDir)); len(tmp) != 0 {
		t.Fatalf("%s: temporary files left: %v", step, tmp)
	}
	if !slices.IsSorted(acked) {
		t.Fatalf("%s: acknowledged out of order: %v", step, acked)
	}
}
