package local

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// TestParseManifestInChunks: a long manifest decoded on several cores
// gives the entries of a line-by-line decode, stops before a torn last
// line, and reports a bad line by its own byte offset.
func TestParseManifestInChunks(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	var buf bytes.Buffer
	var want []schemas.ShardEntry
	var at []int64 // byte offset of each line
	for i := 0; buf.Len() < 5*manifestChunk; i++ {
		e := schemas.ShardEntry{Writer: "w", Path: fmt.Sprintf("policy=0/part-w-%07d.parquet", i), Rows: int64(i),
			GroupKeys: []string{fmt.Sprintf("task-%d", i), strings.Repeat("k", i%300)}}
		line, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		at = append(at, int64(buf.Len()))
		buf.Write(line)
		buf.WriteByte('\n')
		want = append(want, e)
	}
	whole := buf.Len()
	buf.WriteString(`{"writer":"w","path":"torn`)
	data := buf.Bytes()
	got, n, err := parseManifest(data, 100)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(whole) || !reflect.DeepEqual(got, want) {
		t.Fatalf("%d entries up to byte %d; want %d up to %d", len(got), n, len(want), whole)
	}
	// A bad line deep in the file, in a later chunk.
	bad := len(at) * 3 / 4
	broken := append([]byte(nil), data[:whole]...)
	broken[at[bad]] = 'x'
	_, _, err = parseManifest(broken, 100)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("byte %d:", 100+at[bad])) {
		t.Fatalf("bad line %d at byte %d: %v", bad, 100+at[bad], err)
	}
	// Nothing whole yet.
	if got, n, err := parseManifest([]byte(`{"path":`), 0); err != nil || n != 0 || len(got) != 0 {
		t.Fatalf("a torn first line: %d entries, %d bytes, %v", len(got), n, err)
	}
}
