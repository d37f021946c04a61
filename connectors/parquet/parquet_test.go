package parquet

import (
	"bytes"
	"context"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet/compress"
)

var testSchema = arrow.NewSchema([]arrow.Field{
	{Name: "id", Type: arrow.PrimitiveTypes.Int64},
	{Name: "tokens", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Int32)},
	{Name: "text", Type: arrow.BinaryTypes.String, Nullable: true},
}, nil)

func record(mem memory.Allocator, first, n, tokens int, rng *rand.Rand) arrow.RecordBatch {
	b := array.NewRecordBuilder(mem, testSchema)
	defer b.Release()
	ids := b.Field(0).(*array.Int64Builder)
	lb := b.Field(1).(*array.ListBuilder)
	vb := lb.ValueBuilder().(*array.Int32Builder)
	tb := b.Field(2).(*array.StringBuilder)
	for i := first; i < first+n; i++ {
		ids.Append(int64(i))
		lb.Append(true)
		for k := 0; k < tokens; k++ {
			vb.Append(int32(rng.Intn(151000)))
		}
		if i%3 == 0 {
			tb.AppendNull()
		} else {
			tb.Append("row text, repeated enough to compress")
		}
	}
	return b.NewRecordBatch()
}

// Small records are gathered in buffered row groups, large ones become
// row groups of their own; either way every value reads back.
func TestWriterRoundTrip(t *testing.T) {
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	rng := rand.New(rand.NewSource(1))
	path := filepath.Join(t.TempDir(), "f.parquet")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter(f, testSchema, Options{RowGroupBytes: 64 << 10, Allocator: mem}, map[string]string{"k": "v"})
	if err != nil {
		t.Fatal(err)
	}
	var want []int64
	var wantTokens [][]int32
	next := 0
	for _, shape := range []struct{ rows, tokens int }{{3, 4}, {5, 2}, {400, 64}, {2, 1}, {1, 0}, {300, 100}, {7, 3}} {
		rec := record(mem, next, shape.rows, shape.tokens, rng)
		lst := rec.Column(1).(*array.List)
		for i := 0; i < shape.rows; i++ {
			want = append(want, int64(next+i))
			s, e := lst.ValueOffsets(i)
			wantTokens = append(wantTokens, append([]int32{}, lst.ListValues().(*array.Int32).Int32Values()[s:e]...))
		}
		next += shape.rows
		if err := w.Write(rec); err != nil {
			t.Fatal(err)
		}
		rec.Release()
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var got []int64
	var gotTokens [][]int32
	err = ReadFile(context.Background(), path, nil, memory.DefaultAllocator, func(rec arrow.RecordBatch) error {
		ids := rec.Column(0).(*array.Int64)
		lst := rec.Column(1).(*array.List)
		for i := 0; i < int(rec.NumRows()); i++ {
			got = append(got, ids.Value(i))
			s, e := lst.ValueOffsets(i)
			gotTokens = append(gotTokens, append([]int32{}, lst.ListValues().(*array.Int32).Int32Values()[s:e]...))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d rows read, %d written", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] || len(gotTokens[i]) != len(wantTokens[i]) {
			t.Fatalf("row %d: id %d (want %d), %d tokens (want %d)", i, got[i], want[i], len(gotTokens[i]), len(wantTokens[i]))
		}
		for k := range wantTokens[i] {
			if gotTokens[i][k] != wantTokens[i][k] {
				t.Fatalf("row %d token %d differs", i, k)
			}
		}
	}
}

// The page writer's zstd codec is ours, arrow-go's process-wide codec is
// left as registered, and what ours writes decodes with arrow's.
func TestZstdCodec(t *testing.T) {
	c, err := compress.GetCodec(compress.Codecs.Zstd)
	if err != nil {
		t.Fatal(err)
	}
	if _, swapped := c.(*fastZstd); swapped {
		t.Fatal("arrow-go's registered zstd codec was replaced")
	}
	z, err := pageCodec()
	if err != nil {
		t.Fatal(err)
	}
	src := bytes.Repeat([]byte("token ids 151644 8948 198 "), 5000)
	for _, level := range []int{1, 3, compress.DefaultCompressionLevel} {
		enc := z.EncodeLevel(nil, src, level)
		if len(enc) >= len(src)/4 {
			t.Errorf("level %d: %d bytes from %d", level, len(enc), len(src))
		}
		dec, err := z.DecodeWithError(make([]byte, len(src)), enc)
		if err != nil || !bytes.Equal(dec, src) {
			t.Fatalf("level %d: round trip failed: %v", level, err)
		}
		if got := z.Codec.Decode(make([]byte, len(src)), enc); !bytes.Equal(got, src) {
			t.Fatalf("level %d: arrow's decoder reads it differently", level)
		}
	}
}
