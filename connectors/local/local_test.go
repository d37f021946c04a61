package local

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

func TestCreateRejectsPathsOutsideData(t *testing.T) {
	st, err := Open(t.TempDir(), "w")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, rel := range []string{"", "../x.parquet", "/etc/x.parquet", "a/../../x.parquet", "_manifest/x.parquet", `a\..\x.parquet`, "a//b.parquet", "./a.parquet", "a/\x00.parquet"} {
		if p, err := st.Create(context.Background(), rel); err == nil {
			p.Abort()
			t.Errorf("Create(%q) accepted", rel)
		}
	}
}

func TestCommitIsAtomicAndListed(t *testing.T) {
	root := t.TempDir()
	st, err := Open(root, "w")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p, err := st.Create(context.Background(), "policy=1/a.parquet")
	if err != nil {
		t.Fatal(err)
	}
	p.Write([]byte("data"))
	if _, err := os.Stat(root + "/policy=1/a.parquet"); !os.IsNotExist(err) {
		t.Fatal("shard visible before commit")
	}
	if err := p.Commit(context.Background(), schemas.ShardEntry{Rows: 3}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(root + "/policy=1/a.parquet"); err != nil || string(b) != "data" {
		t.Fatalf("published %q %v", b, err)
	}
	e, err := ReadManifest(root)
	if err != nil || len(e) != 1 || e[0].Path != "policy=1/a.parquet" || e[0].Bytes != 4 || e[0].Rows != 3 || e[0].Writer != "w" {
		t.Fatalf("manifest %+v %v", e, err)
	}
	if _, err := st.Create(context.Background(), "policy=1/a.parquet"); err == nil {
		t.Fatal("overwrote a committed shard")
	}
}

func TestDeadLetterFile(t *testing.T) {
	path := t.TempDir() + "/_dlq/run.jsonl"
	d := NewDeadLetterFile(path, "_dlq/run.jsonl")
	bad := []byte("{\"x\":\"\xff\"}")
	err := d.Write(context.Background(), []schemas.DeadLetter{
		{Reason: schemas.ReasonMalformedJSON, Error: "e1", Source: schemas.Source{File: "f", Line: 1}, Record: []byte(`{"a":<b>}`)},
		{Reason: schemas.ReasonWrongType, Error: "e2", Source: schemas.Source{File: "f", Line: 2}, Record: bad},
		{Reason: schemas.ReasonTooLarge, Error: "e3", Source: schemas.Source{Stream: "s", File: "f", Line: 3}, Record: []byte("{"), Truncated: true, Size: 1 << 30},
	}, []schemas.Source{{Stream: "s", Line: 4}, {Line: 5}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	settled, state, err := d.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := os.Stat(path); state == nil || state.File != "_dlq/run.jsonl" || info.Size() != state.Bytes || len(settled["s"]) != 1 || settled["s"][0] != [2]int64{3, 4} || len(settled) != 1 {
		t.Fatalf("checkpoint %+v settled %v", state, settled)
	}
	if again, _, _ := d.Checkpoint(ctx); again != nil {
		t.Fatalf("settled twice: %v", again)
	}
	// Letters after the checkpoint, then a reset: they are cut.
	if err := d.Write(ctx, []schemas.DeadLetter{{Reason: schemas.ReasonWrongType, Source: schemas.Source{Stream: "s", Line: 9}, Record: []byte("[]")}}, nil); err != nil {
		t.Fatal(err)
	}
	d.Reset()
	if s, st, _ := d.Checkpoint(ctx); s != nil || st.Bytes != state.Bytes {
		t.Fatalf("after reset: settled %v state %+v", s, st)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []schemas.DeadLetterLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l schemas.DeadLetterLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	if len(lines) != 3 || lines[0].Record != `{"a":<b>}` || lines[0].RecordEncoding != "" || lines[0].Source.Line != 1 {
		t.Fatalf("%+v", lines)
	}
	raw, err := base64.StdEncoding.DecodeString(lines[1].Record)
	if err != nil || string(raw) != string(bad) || lines[1].RecordEncoding != "base64" {
		t.Fatalf("base64 record: %+v", lines[1])
	}
	if !lines[2].Truncated || lines[2].Size != 1<<30 {
		t.Fatalf("truncated record: %+v", lines[2])
	}
	if c := d.Counts(); c[schemas.ReasonWrongType] != 1 || len(c) != 3 {
		t.Fatalf("counts %v", c)
	}
}

// The store never deletes through a symbolic link: a _tmp that is a link
// is refused, and the files of its target stay.
func TestSymlinkedFolderRefused(t *testing.T) {
	root, target := t.TempDir(), t.TempDir()
	victim := target + "/r.0123456789abcdef.tmp" // named like a temporary file
	if err := os.WriteFile(victim, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, root+"/"+TmpDir); err != nil {
		t.Fatal(err)
	}
	if st, err := Open(root, "w"); err == nil {
		st.Close()
		t.Fatal("opened a root whose _tmp is a symbolic link")
	}
	if _, err := os.Stat(victim); err != nil {
		t.Fatalf("the link's target lost a file: %v", err)
	}
}

func TestSecondWriterMessage(t *testing.T) {
	root := t.TempDir()
	a, err := Open(root, "first-run")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	_, err = Open(root, "second-run")
	if !errors.Is(err, store.ErrLocked) || !strings.Contains(err.Error(), "first-run") || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
		t.Fatalf("second writer: %v", err)
	}
}

// A writer opens from the state the last clean writer left and the
// manifest after it, and from the registration of a writer that died:
// what that one committed is settled, its unlisted shard removed, and the
// entries go on numbering where the manifest ends.
func TestWriterStateAndDeadWriter(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	commit := func(st *Store, seq int, pos int64) {
		t.Helper()
		rel := fmt.Sprintf("policy=0/part-%s-%06d.parquet", st.writer, seq)
		p, err := st.Create(ctx, rel)
		if err != nil {
			t.Fatal(err)
		}
		p.Write([]byte("x"))
		if err := p.Commit(ctx, schemas.ShardEntry{Rows: 1, Settled: schemas.Settled{"f": {{pos, pos}}}}); err != nil {
			t.Fatal(err)
		}
	}
	w1, err := Open(root, "w1")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		commit(w1, i, int64(i))
	}
	if err := w1.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := readState(root)
	if err != nil || st.Entries != 10 || st.Settled["f"].Len() != 10 {
		t.Fatalf("state after a clean close: %+v %v", st, err)
	}
	w2, err := Open(root, "w2")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		commit(w2, i, int64(10+i))
	}
	orphan := filepath.Join(root, "policy=0", "part-w2-000099.parquet")
	if err := os.WriteFile(orphan, []byte("published, never listed"), 0o644); err != nil {
		t.Fatal(err)
	}
	Crash(w2)
	// Prove that w3 reads from the state on: a line before it that no
	// reader could parse is not read.
	data, _ := os.ReadFile(filepath.Join(root, ManifestDir, ManifestFile))
	garbled := append([]byte("{"), data[1:]...)
	if err := os.WriteFile(filepath.Join(root, ManifestDir, ManifestFile), garbled, 0o644); err != nil {
		t.Fatal(err)
	}
	w3, err := Open(root, "w3")
	if err != nil {
		t.Fatal(err)
	}
	if s := w3.Settled(); s["f"].Len() != 15 || s["f"][0] != [2]int64{0, 14} {
		t.Fatalf("settled %v", s)
	}
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Fatal("the dead writer's unlisted shard is still there")
	}
	for _, rel := range []string{"policy=0/part-w1-000009.parquet", "policy=0/part-w2-000004.parquet"} {
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(rel))); err != nil {
			t.Fatalf("committed %s: %v", rel, err)
		}
	}
	commit(w3, 0, 15)
	if err := w3.Close(); err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(filepath.Join(root, ManifestDir, ManifestFile))
	lines := bytes.Split(bytes.TrimSuffix(after, []byte("\n")), []byte("\n"))
	var last schemas.ShardEntry
	if err := json.Unmarshal(lines[len(lines)-1], &last); err != nil || last.Seq != 15 || last.Writer != "w3" || len(lines) != 16 {
		t.Fatalf("w3's entry: %+v %v (%d lines)", last, err, len(lines))
	}
	reg, _ := readWriters(root)
	if len(reg.open) != 0 {
		t.Fatalf("writers left open: %v", reg.open)
	}
}

// TestObjectsRemoveDeadCreatorsTemps: a temporary file a creator killed
// mid-Create left behind is removed by the next writer's first Create
// once it is older than any live Create could be; a recent one (maybe a
// live creator's) stays, and reading never removes anything.
func TestObjectsRemoveDeadCreatorsTemps(t *testing.T) {
	root := t.TempDir()
	r, err := OpenReader(root)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := r.Objects("_consumers/g")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "_consumers", "g")
	old, recent := filepath.Join(dir, ".tmp-123"), filepath.Join(dir, ".tmp-456")
	for _, f := range []string{old, recent} {
		if err := os.WriteFile(f, []byte("partial"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	past := time.Now().Add(-staleTemp - time.Minute)
	if err := os.Chtimes(old, past, past); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := obj.List(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); err != nil {
		t.Fatalf("a read removed a temporary file: %v", err)
	}
	if err := obj.Create(ctx, "0001", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the dead creator's temporary file is still there (%v)", err)
	}
	if _, err := os.Stat(recent); err != nil {
		t.Errorf("a recent temporary file was removed: %v", err)
	}
	names, err := obj.List(ctx, "")
	if err != nil || strings.Join(names, ",") != "0001" {
		t.Errorf("objects %v (%v), want 0001", names, err)
	}
}
