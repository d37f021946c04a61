package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// eachChunk hands every chunk src reads to f, until the end of the input.
func eachChunk(t *testing.T, src *LineSource, f func(Chunk)) {
	t.Helper()
	for {
		c, err := src.Read(context.Background())
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		f(c)
	}
}

func readAll(t *testing.T, s Source) ([]Raw, int64) {
	t.Helper()
	var out []Raw
	var blank int64
	var lines lineNumbering
	for {
		c, err := s.Read(context.Background())
		c.Split()
		lines.number(c.Lines, len(c.Records), func(i int) *schemas.Source { return &c.Records[i].Source })
		out = append(out, c.Records...)
		blank += c.Blank
		if errors.Is(err, io.EOF) {
			return out, blank
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestLineSource(t *testing.T) {
	long := strings.Repeat("x", 3000)
	in := "\xef\xbb\xbfa\r\n\n  \t\nb\n" + long + "\nc"
	s := NewLineSource("in", strings.NewReader(in), nil, 2048)
	recs, blank := readAll(t, s)
	if blank != 2 || len(recs) != 4 {
		t.Fatalf("blank %d records %d", blank, len(recs))
	}
	if string(recs[0].Data) != "a" || recs[0].Source.Line != 1 || string(recs[1].Data) != "b" || recs[1].Source.Line != 4 {
		t.Fatalf("%+v %+v", recs[0], recs[1])
	}
	if !recs[2].Truncated || recs[2].Size != 3000 || recs[2].Source.Line != 5 || !bytes.HasPrefix([]byte(long), recs[2].Data) {
		t.Fatalf("too large: trunc %v size %d line %d", recs[2].Truncated, recs[2].Size, recs[2].Source.Line)
	}
	huge := strings.Repeat("y", keepTooLarge*3)
	recs2, _ := readAll(t, NewLineSource("in", strings.NewReader(huge+"\nz"), nil, keepTooLarge*2))
	if len(recs2) != 2 || !recs2[0].Truncated || len(recs2[0].Data) != keepTooLarge || recs2[0].Size != int64(len(huge)) || string(recs2[1].Data) != "z" {
		t.Fatalf("huge line: %d records, kept %d bytes, size %d", len(recs2), len(recs2[0].Data), recs2[0].Size)
	}
	if string(recs[3].Data) != "c" || recs[3].Source.Line != 6 || recs[3].Truncated {
		t.Fatalf("%+v", recs[3])
	}
}

func TestDecodeStageKeepsOrder(t *testing.T) {
	var b strings.Builder
	for i := range 20000 {
		if i%7 == 0 {
			b.WriteString("{bad\n")
			continue
		}
		b.WriteString(strings.Replace(goodStep, `"s1"`, `"s`+strings.Repeat("x", i%5)+`"`, 1) + "\n")
	}
	src := NewLineSource("in", strings.NewReader(b.String()), nil, 0)
	src.chunkSize = 4096 // many chunks, so that workers interleave
	out := make(chan Batch, 1)
	errc := make(chan error, 1)
	go func() { errc <- DecodeStage(context.Background(), src, 4, out) }()
	var line int64
	for batch := range out {
		for _, it := range batch.Items {
			line++
			if it.Source.Line != line {
				t.Fatalf("item %d has line %d", line, it.Source.Line)
			}
			if bad := (line-1)%7 == 0; bad != (it.Err != nil) {
				t.Fatalf("line %d: err %v", line, it.Err)
			}
			if it.Err != nil && it.Err.Reason != schemas.ReasonMalformedJSON {
				t.Fatalf("line %d: %v", line, it.Err)
			}
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if line != 20000 {
		t.Fatalf("%d items", line)
	}
}

func TestDecodeStageCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	src := NewLineSource("in", strings.NewReader(strings.Repeat(goodStep+"\n", 100000)), nil, 0)
	out := make(chan Batch) // never read
	errc := make(chan error, 1)
	go func() { errc <- DecodeStage(ctx, src, 2, out) }()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
}

type failingReader struct{ n int }

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n > 0 {
		f.n--
		return copy(p, goodStep+"\n"), nil
	}
	return 0, errors.New("disk on fire")
}

func TestDecodeStageReadErrorLeavesOutputOpen(t *testing.T) {
	src := NewLineSource("in", &failingReader{n: 3}, nil, 0)
	out := make(chan Batch, 16)
	err := DecodeStage(context.Background(), src, 2, out)
	if err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("err %v", err)
	}
	for {
		select {
		case _, ok := <-out:
			if !ok {
				t.Fatal("output closed after a read error: downstream would take it for the end of input")
			}
		default:
			return
		}
	}
}

func TestQuietStreamDeliversWithoutWaitingAndStops(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close()
	src := NewLineSource("-", pr, nil, 0)
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan Batch, 4)
	errc := make(chan error, 1)
	go func() { errc <- DecodeStage(ctx, src, 1, out) }()
	go pw.Write([]byte(goodStep + "\n")) // then the writer goes quiet
	b := <-out
	if len(b.Items) != 1 || b.Items[0].Err != nil {
		t.Fatalf("got %+v", b)
	}
	cancel() // a stop while the read is blocked on the pipe
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
	pw.Close() // lets the abandoned read return before goleak looks
}

// Records of a file are referenced, not copied: every reference reads back
// exactly the record's bytes (byte-order mark, CRLF, blank lines, a last
// line without newline, lines held over to the next chunk), and a decoded
// item keeps the reference instead of a copy, while a rejected one keeps
// its bytes.
func TestFileRecordsReadAgain(t *testing.T) {
	var in strings.Builder
	in.WriteString("\xef\xbb\xbf{\"a\":1}\r\n\n  \n")
	for i := 0; i < 300; i++ {
		fmt.Fprintf(&in, "{\"line\":%d,\"pad\":%q}\n", i, strings.Repeat("x", i*37%5000))
	}
	in.WriteString("{\"last\":true}")
	path := filepath.Join(t.TempDir(), "in.jsonl")
	if err := os.WriteFile(path, []byte(in.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := OpenFile(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	src.chunkSize = 4 << 10 // many chunks, lines held over
	var n int
	for {
		c, err := src.Read(context.Background())
		c.Split()
		for _, r := range c.Records {
			n++
			if !r.Ref.Valid() {
				t.Fatalf("line %d: no reference", r.Source.Line)
			}
			b, err := readAgain(r.Ref)
			if err != nil || !bytes.Equal(b, r.Data) {
				t.Fatalf("line %d: read again %q (%v), want %q", r.Source.Line, b, err, r.Data)
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if n != 302 {
		t.Fatalf("%d records, want 302", n)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}

	// Through the decoder: a good record is kept by reference, a bad one
	// by copy.
	if err := os.WriteFile(path, []byte("{\"type\":\"trajectory\",\"trajectory_id\":\"t\",\"task_id\":\"k\",\"reward\":1,\"num_steps\":1}\n{bad\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	src, err = OpenFile(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	c, err := src.Read(context.Background())
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	var d Decoder
	b := decodeChunk(&d, c)
	if len(b.Items) != 2 {
		t.Fatalf("%d items", len(b.Items))
	}
	good, bad := b.Items[0], b.Items[1]
	if good.Err != nil || good.Raw != nil || !good.Ref.Valid() {
		t.Fatalf("good record: err %v, raw %q, ref %v", good.Err, good.Raw, good.Ref.Valid())
	}
	if bad.Err == nil || string(bad.Raw) != "{bad" {
		t.Fatalf("bad record: err %v, raw %q", bad.Err, bad.Raw)
	}
	if rec, err := readAgain(good.Ref); err != nil || !strings.HasPrefix(string(rec), `{"type":"trajectory"`) {
		t.Fatalf("good record read again: %q, %v", rec, err)
	}
	// A file changed under the run: the reference says so.
	if err := os.WriteFile(path, []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readAgain(good.Ref); err == nil {
		t.Fatal("a record read again from a truncated file")
	}
}

// openMapped writes content to a file and opens it mapped (closed at the
// end of the test); it skips the test where files are not mapped.
func openMapped(t *testing.T, content string, maxRecord int) (*LineSource, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "in.jsonl")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := OpenFile(path, maxRecord)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	if src.m == nil {
		t.Skip("no memory mapping on this system")
	}
	return src, path
}

// A mapped file: lines appended after it was opened are read after the
// mapping, a line over the limit is cut to its head and flagged, and
// every line keeps its number.
func TestMappedFileGrowsAndLongLines(t *testing.T) {
	long := `{"x":"` + strings.Repeat("y", 3*keepTooLarge) + `"}`
	src, path := openMapped(t, "{\"a\":1}\n"+long+"\n{\"b\":2}", 2*keepTooLarge)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("{\"c\":3}\n{\"d\":4}\n"); err != nil { // the last mapped line had no newline
		t.Fatal(err)
	}
	f.Close()
	recs, _ := readAll(t, src)
	var got []string
	for _, r := range recs {
		got = append(got, fmt.Sprintf("%d:%d:%v", r.Source.Line, len(r.Data), r.Truncated))
	}
	want := []string{"1:7:false", fmt.Sprintf("2:%d:true", keepTooLarge), `3:14:false`, "4:7:false"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("records %v, want %v", got, want)
	}
	if string(recs[2].Data) != `{"b":2}{"c":3}` {
		t.Fatalf("line 3 is %q", recs[2].Data)
	}
	if recs[1].Size != int64(len(long)) {
		t.Fatalf("long line size %d, want %d", recs[1].Size, len(long))
	}
}

// A file that shrinks while it is read ends the decode stage with an
// error, not a crash (the mapping's lost pages fault).
func TestMappedFileShrinkingFails(t *testing.T) {
	src, path := openMapped(t, strings.Repeat(goodStep+"\n", 20000), 0)
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	out := make(chan Batch, 1000)
	err := DecodeStage(context.Background(), src, 2, out)
	if !errors.Is(err, errInputChanged) {
		t.Fatalf("DecodeStage: %v, want %v", err, errInputChanged)
	}
}

// A line over a limit smaller than the head kept for dead letters is kept
// whole and flagged, as the buffered reader does; chunks released after
// Close touch nothing.
func TestMappedSmallLimit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "in.jsonl")
	line := `{"x":"` + strings.Repeat("y", 200) + `"}`
	if err := os.WriteFile(path, []byte(line+"\n{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, mapped := range []bool{true, false} {
		src := NewLineSource("in", strings.NewReader(line+"\n{}\n"), nil, 100)
		if mapped {
			var err error
			if src, err = OpenFile(path, 100); err != nil {
				t.Fatal(err)
			}
			if src.m == nil {
				t.Skip("no memory mapping on this system")
			}
		}
		c, err := src.Read(context.Background())
		if err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		c.Split()
		if len(c.Records) != 2 || !c.Records[0].Truncated || string(c.Records[0].Data) != line || c.Records[0].Size != int64(len(line)) || c.Records[1].Truncated {
			t.Fatalf("mapped %v: records %+v", mapped, c.Records)
		}
		if err := src.Close(); err != nil {
			t.Fatal(err)
		}
		if c.Release != nil {
			c.Release() // after Close: must not touch the unmapped range
		}
	}
}

// A mapped file split into many chunks, decoded on several goroutines:
// every record keeps its line number in the file, blank lines, a CRLF and
// a byte-order mark included, and lines appended after the mapping go on
// counting from it.
func TestMappedLineNumbers(t *testing.T) {
	var in strings.Builder
	in.WriteString("\xef\xbb\xbf")
	want := map[string]int64{}
	line := int64(0)
	for i := range 3000 {
		line++
		switch {
		case i%7 == 3:
			in.WriteString("  \n")
			continue
		case i%11 == 5:
			fmt.Fprintf(&in, "{\"n\":%d,\"pad\":%q}\r\n", i, strings.Repeat("p", i%300))
		default:
			fmt.Fprintf(&in, "{\"n\":%d,\"pad\":%q}\n", i, strings.Repeat("p", i%300))
		}
		want[fmt.Sprint(i)] = line
	}
	src, path := openMapped(t, in.String(), 0)
	src.chunkSize = 2 << 10
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := 3000; i < 3100; i++ {
		fmt.Fprintf(f, "{\"n\":%d}\n", i)
		line++
		want[fmt.Sprint(i)] = line
	}
	f.Close()
	out := make(chan Batch, 10)
	errc := make(chan error, 1)
	go func() { errc <- DecodeStage(context.Background(), src, 3, out) }()
	seen := 0
	for b := range out {
		for _, it := range b.Items {
			raw := it.Raw
			if raw == nil {
				t.Fatalf("line %d: decoded, want rejected", it.Source.Line)
			}
			var v struct{ N int }
			if err := json.Unmarshal(raw, &v); err != nil {
				t.Fatalf("line %d: %q: %v", it.Source.Line, raw, err)
			}
			if w := want[fmt.Sprint(v.N)]; it.Source.Line != w {
				t.Fatalf("record %d numbered line %d, want %d", v.N, it.Source.Line, w)
			}
			seen++
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if seen != len(want) {
		t.Fatalf("%d records, want %d", seen, len(want))
	}
}

// A mapped file's chunks are handed out in place, their pages populated
// at once; where they cannot be (copyChunks), they are read with pread
// into recycled chunk buffers, and a line longer than a buffer is served
// from the mapping. Either way every line comes out whole, numbered, and
// referenced at its offset, and a released buffer is reused without
// changing what was handed out before.
func TestMappedReadCopy(t *testing.T) {
	var in strings.Builder
	var want []string
	for i := range 300 {
		n := 1 + (i*7919)%3000
		if i%50 == 7 {
			n = 200 << 10 // over a chunk buffer: from the mapping
		}
		l := fmt.Sprintf("%d:%s", i, strings.Repeat("z", n))
		want = append(want, l)
		in.WriteString(l + "\n")
	}
	for _, copyChunks := range []bool{false, true} {
		t.Run(fmt.Sprintf("copyChunks=%v", copyChunks), func(t *testing.T) {
			readMapped(t, in.String(), want, copyChunks)
		})
	}
}

func readMapped(t *testing.T, in string, want []string, copyChunks bool) {
	src, _ := openMapped(t, in, 0)
	src.chunkSize = 4 << 10
	src.copyChunks = copyChunks
	populates := populate(src.m.data[:pageSize]) == nil
	var got []Raw
	var lines lineNumbering
	copied, fromMap := 0, 0
	eachChunk(t, src, func(c Chunk) {
		if c.whole != nil && len(c.whole.data) > 0 && src.m != nil && &c.whole.data[0] == &src.m.data[c.whole.off] {
			fromMap++
		} else {
			copied++
		}
		c.Split()
		lines.number(c.Lines, len(c.Records), func(i int) *schemas.Source { return &c.Records[i].Source })
		for _, r := range c.Records {
			r.Data = []byte(string(r.Data)) // kept past Release
			got = append(got, r)
		}
		c.Release()
	})
	switch {
	case copyChunks && (copied == 0 || fromMap == 0):
		t.Fatalf("%d chunks copied, %d from the mapping: want both", copied, fromMap)
	case !copyChunks && populates && copied > 0:
		t.Fatalf("%d chunks copied, %d from the mapping: want every chunk from the mapping (populated)", copied, fromMap)
	case !copyChunks && !populates && runtime.GOOS == "linux":
		t.Logf("the kernel cannot populate a mapping: %d chunks copied, %d from the mapping", copied, fromMap)
	}
	if len(got) != len(want) {
		t.Fatalf("%d lines, want %d", len(got), len(want))
	}
	var off int64
	for i, r := range got {
		if string(r.Data) != want[i] || r.Source.Line != int64(i+1) || r.Ref.Off != off || r.Ref.Len != len(want[i]) {
			t.Fatalf("line %d: %q... line %d ref %+v, want offset %d", i+1, r.Data[:min(10, len(r.Data))], r.Source.Line, r.Ref, off)
		}
		if b, err := readAgain(r.Ref); err != nil || string(b) != want[i] {
			t.Fatalf("line %d read again: %v", i+1, err)
		}
		off += int64(len(want[i])) + 1
	}
}

// A byte-order mark counts toward no record's size: a first record of
// exactly the limit after one is taken whole from a stream and from a
// mapped file alike, and one byte more is too large in both.
func TestBOMOutsideTheSizeLimit(t *testing.T) {
	const limit = 8 << 10
	for _, extra := range []int{0, 1} {
		rec := `{"pad":"` + strings.Repeat("x", limit-10+extra) + `"}`
		in := "\xef\xbb\xbf" + rec + "\n{}\n"
		mapped, _ := openMapped(t, in, limit)
		for name, src := range map[string]Source{
			"stream": NewLineSource("-", strings.NewReader(in), nil, limit),
			"mapped": mapped,
		} {
			recs, _ := readAll(t, src)
			if len(recs) != 2 || recs[0].Truncated != (extra > 0) || recs[0].Size != int64(len(rec)) {
				t.Fatalf("%s, record of %d bytes (limit %d): %d records, truncated %v, size %d",
					name, len(rec), limit, len(recs), recs[0].Truncated, recs[0].Size)
			}
			if extra == 0 && string(recs[0].Data) != rec {
				t.Fatalf("%s: the record is not whole", name)
			}
		}
	}
}

// readAgain reads the one record ref points to again.
func readAgain(ref RawRef) ([]byte, error) {
	recs, errs, err := ref.From.Reread(context.Background(), []RawRef{ref})
	if err != nil {
		return nil, err
	}
	return recs[0], errs[0]
}
