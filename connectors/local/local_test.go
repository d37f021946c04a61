package local

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

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
