package compare

import (
	"bytes"
	"fmt"
	"reflect"
	"sync"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
)

// rowsOf are the Parquet benchmarks' rows: the steps of 200 groups (about
// 5,000 steps) of the JSON benchmarks' shape, with and without messages.
var rowsOf = sync.OnceValue(func() map[string][]Row {
	out := map[string][]Row{}
	for name, msgs := range map[string]bool{"messages": true, "nomsg": false} {
		data, err := Records(200, msgs)
		if err != nil {
			panic(err)
		}
		if out[name], err = Rows(data); err != nil {
			panic(err)
		}
	}
	return out
})

// writers are the contenders: each writes the same rows to a file.
var writers = []struct {
	name  string
	write func(w *bytes.Buffer, rows []Row, recs []arrow.RecordBatch) error
}{
	{"ours", func(w *bytes.Buffer, _ []Row, recs []arrow.RecordBatch) error { return WriteOurs(w, recs, false) }},
	{"ours-compact", func(w *bytes.Buffer, _ []Row, recs []arrow.RecordBatch) error { return WriteOurs(w, recs, true) }},
	{"pqarrow", func(w *bytes.Buffer, _ []Row, recs []arrow.RecordBatch) error { return WritePqarrow(w, recs) }},
	{"parquet-go", func(w *bytes.Buffer, rows []Row, _ []arrow.RecordBatch) error { return WriteParquetGo(w, rows) }},
}

// TestSameRows checks that the three writers' files read back to the
// same rows, so the benchmark compares equal output, and logs the sizes.
func TestSameRows(t *testing.T) {
	for name, rows := range rowsOf() {
		recs := ArrowRecords(rows, 2048)
		for _, wr := range writers {
			var buf bytes.Buffer
			if err := wr.write(&buf, rows, recs); err != nil {
				t.Fatalf("%s/%s: %v", name, wr.name, err)
			}
			got, err := ReadRows(buf.Bytes())
			if err != nil {
				t.Fatalf("%s/%s: read back: %v", name, wr.name, err)
			}
			if len(got) != len(rows) {
				t.Fatalf("%s/%s: %d rows read back, want %d", name, wr.name, len(got), len(rows))
			}
			for i := range rows {
				if !reflect.DeepEqual(got[i], rows[i]) {
					t.Fatalf("%s/%s: row %d differs", name, wr.name, i)
				}
			}
			t.Logf("%s/%s: %d rows, %d bytes", name, wr.name, len(rows), buf.Len())
		}
		for _, r := range recs {
			r.Release()
		}
	}
}

// BenchmarkParquet writes the same rows with each writer on one
// goroutine, alternated round by round: MB/s of the rows' Arrow buffers
// and the file size (bytes and against ours).
func BenchmarkParquet(b *testing.B) {
	for _, name := range []string{"messages", "nomsg"} {
		rows := rowsOf()[name]
		recs := ArrowRecords(rows, 2048)
		var raw int64
		for _, r := range recs {
			for _, c := range r.Columns() {
				for _, buf := range c.Data().Buffers() {
					if buf != nil {
						raw += int64(buf.Len())
					}
				}
				for _, ch := range c.Data().Children() {
					for _, buf := range ch.Buffers() {
						if buf != nil {
							raw += int64(buf.Len())
						}
					}
				}
			}
		}
		sizes := map[string]int{}
		b.Run(name, func(b *testing.B) {
			names := make([]string, len(writers))
			for i, w := range writers {
				names[i] = w.name
			}
			forRounds(b, names, func(b *testing.B, c string) {
				var buf bytes.Buffer
				for _, w := range writers {
					if w.name != c {
						continue
					}
					b.SetBytes(raw)
					b.ReportAllocs()
					for b.Loop() {
						buf.Reset()
						if err := w.write(&buf, rows, recs); err != nil {
							b.Fatal(err)
						}
					}
				}
				sizes[c] = buf.Len()
				b.ReportMetric(float64(buf.Len()), "file-bytes")
				noteExtra("BenchmarkParquet/"+name+"/"+c, fmt.Sprintf("file %.1f MB (%.3f of ours)", float64(buf.Len())/1e6, float64(buf.Len())/float64(sizes["ours"])))
			})
		})
		for _, r := range recs {
			r.Release()
		}
	}
}
