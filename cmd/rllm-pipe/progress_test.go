package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// Progress is for terminals only: piped or redirected, nothing is drawn.
func TestProgressQuietWhenNotATerminal(t *testing.T) {
	var buf bytes.Buffer
	f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	for name, out := range map[string]interface{ Write([]byte) (int, error) }{"buffer": &buf, "file": f, "pipe": w} {
		p := newProgress(out, "ingest", 100, true, false)
		if p.bar != nil {
			t.Errorf("%s: a bar is drawn", name)
		}
		p.update(50, 100)
		stop := p.follow(func() int64 { return 100 })
		stop()
	}
	if buf.Len() != 0 {
		t.Fatalf("wrote %q", buf.String())
	}
	if info, _ := f.Stat(); info.Size() != 0 {
		t.Fatalf("wrote %d bytes to a file", info.Size())
	}
}
