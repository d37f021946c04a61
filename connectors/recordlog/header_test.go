package recordlog

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestHeaderShape(t *testing.T) {
	h := newHeader()
	if len(h) != HeaderSize || h[len(h)-1] != '\n' {
		t.Fatalf("header is %d bytes, last %q", len(h), h[len(h)-1])
	}
	if len(bytes.TrimSpace(h)) != 0 {
		t.Fatal("header holds something other than whitespace: readers would take it for a record")
	}
	if n := int64(bytes.Count(h, []byte{'\n'})); n != HeaderLines {
		t.Fatalf("header has %d lines, HeaderLines %d", n, HeaderLines)
	}
	if bytes.Equal(h, newHeader()) {
		t.Fatal("two headers are equal: their files would share a stream identity")
	}
}

// FuzzReadHeader: readHeader accepts exactly the headers header makes,
// and the stream it returns is the nonce's.
func FuzzReadHeader(f *testing.F) {
	f.Add(newHeader())
	f.Add([]byte(strings.Repeat(" ", HeaderSize)))
	f.Add(append(newHeader()[:HeaderSize-1], 'x'))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(dir, "h")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		fh, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer fh.Close()
		stream, err := readHeader(fh)
		if err != nil {
			return
		}
		if len(data) < HeaderSize || !strings.HasPrefix(stream, "recordlog/") || len(stream) != len("recordlog/")+nonceBits/4 {
			t.Fatalf("accepted %d bytes as a header, stream %q", len(data), stream)
		}
		if len(bytes.TrimSpace(data[:HeaderSize])) != 0 || data[HeaderSize-1] != '\n' {
			t.Fatal("accepted a header that is not blank lines")
		}
	})
}
