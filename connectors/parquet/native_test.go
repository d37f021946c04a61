package parquet

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand"
	"slices"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	pq "github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/metadata"
	"github.com/klauspost/compress/huff0"
	"github.com/klauspost/compress/zstd"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// randomRecord fills every column of sc with random values: nulls where
// the field allows them, empty and long lists, maps with null items,
// strings with bytes of every kind, extreme numbers.
func randomRecord(mem memory.Allocator, sc *arrow.Schema, n int, rng *rand.Rand) arrow.RecordBatch {
	b := array.NewRecordBuilder(mem, sc)
	defer b.Release()
	for i, f := range sc.Fields() {
		for r := 0; r < n; r++ {
			if f.Nullable && rng.Intn(4) == 0 {
				b.Field(i).AppendNull()
				continue
			}
			appendRandom(b.Field(i), rng)
		}
	}
	return b.NewRecordBatch()
}

func appendRandom(b array.Builder, rng *rand.Rand) {
	switch b := b.(type) {
	case *array.Int32Builder:
		b.Append([]int32{0, 1, -1, math.MaxInt32, math.MinInt32, int32(rng.Intn(151000))}[rng.Intn(6)])
	case *array.Int64Builder:
		b.Append([]int64{0, -7, math.MaxInt64, math.MinInt64, rng.Int63()}[rng.Intn(5)])
	case *array.Float32Builder:
		b.Append([]float32{0, float32(math.Copysign(0, -1)), -float32(rng.ExpFloat64()), float32(math.Inf(-1))}[rng.Intn(4)])
	case *array.Float64Builder:
		b.Append([]float64{0, math.Copysign(0, -1), rng.NormFloat64(), math.NaN(), math.Inf(1), -1e300}[rng.Intn(6)])
	case *array.BooleanBuilder:
		b.Append(rng.Intn(2) == 0)
	case *array.StringBuilder:
		const alphabet = "ab\x00\"\\é{}[]\n" // é split: invalid UTF-8 too
		s := make([]byte, rng.Intn(40))
		for i := range s {
			s[i] = alphabet[rng.Intn(len(alphabet))]
		}
		b.Append(string(s))
	case *array.TimestampBuilder:
		b.Append(arrow.Timestamp(rng.Int63n(1 << 52)))
	case *array.ListBuilder:
		k := []int{0, 1, 2, 7, 300}[rng.Intn(5)]
		b.Append(true)
		for j := 0; j < k; j++ {
			appendRandom(b.ValueBuilder(), rng)
		}
	case *array.MapBuilder:
		k := rng.Intn(4)
		b.Append(true)
		for j := 0; j < k; j++ {
			appendRandom(b.KeyBuilder(), rng)
			if rng.Intn(3) == 0 {
				b.ItemBuilder().AppendNull()
			} else {
				appendRandom(b.ItemBuilder(), rng)
			}
		}
	default:
		panic(fmt.Sprintf("no random values for %T", b))
	}
}

// writeAll writes recs with a fresh writer and returns the file.
func writeAll(t *testing.T, sc *arrow.Schema, opts Options, recs []arrow.RecordBatch) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, sc, opts, map[string]string{"k": "v"})
	if err != nil {
		t.Fatal(err)
	}
	if (w.nw != nil) == opts.Reference {
		t.Fatalf("Reference=%v but native=%v", opts.Reference, w.nw != nil)
	}
	for _, r := range recs {
		if err := w.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.AddMetadata("late", "yes"); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if w.Written() != int64(buf.Len()) {
		t.Fatalf("Written %d, file has %d bytes", w.Written(), buf.Len())
	}
	return buf.Bytes()
}

// readAll reads a file back with arrow-go's reader into one record per
// row group.
func readAll(t *testing.T, data []byte, mem memory.Allocator) []arrow.RecordBatch {
	t.Helper()
	r, err := OpenStored(context.Background(), "f", bytes.NewReader(data), nil, mem)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var out []arrow.RecordBatch
	for {
		rec, err := r.Next()
		if err != nil {
			break
		}
		rec.Retain()
		out = append(out, rec)
	}
	return out
}

// The native encoder and arrow-go's writer (the reference) produce files
// that read back to the same values, row for row, over random records of
// every column type of the step schema, sliced records, and row groups
// cut inside records.
func TestNativeMatchesReference(t *testing.T) {
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	for seed := int64(1); seed <= 4; seed++ {
		rng := rand.New(rand.NewSource(seed))
		var recs []arrow.RecordBatch
		for i := 0; i < 5; i++ {
			rec := randomRecord(mem, schemas.StepSchema, 1+rng.Intn(300), rng)
			if i%2 == 1 { // a slice: arrays with offsets
				s := rec.NewSlice(1, rec.NumRows())
				rec.Release()
				rec = s
			}
			recs = append(recs, rec)
		}
		rg := []int64{1 << 10, 64 << 10, 16 << 20}[seed%3]
		native := writeAll(t, schemas.StepSchema, Options{RowGroupBytes: rg}, recs)
		ref := writeAll(t, schemas.StepSchema, Options{RowGroupBytes: rg, Reference: true}, recs)
		got, want := concat(t, mem, readAll(t, native, mem)), concat(t, mem, readAll(t, ref, mem))
		if !array.RecordApproxEqual(got, want, array.WithNaNsEqual(true)) {
			t.Fatalf("seed %d: native and reference files differ:\nnative %v\nref    %v", seed, got, want)
		}
		var rows int64
		for _, r := range recs {
			rows += r.NumRows()
		}
		if got.NumRows() != rows {
			t.Fatalf("seed %d: %d rows read, %d written", seed, got.NumRows(), rows)
		}
		checkFooter(t, native, ref)
		got.Release()
		want.Release()
		for _, r := range recs {
			r.Release()
		}
	}
}

func concat(t *testing.T, mem memory.Allocator, recs []arrow.RecordBatch) arrow.RecordBatch {
	t.Helper()
	defer func() {
		for _, r := range recs {
			r.Release()
		}
	}()
	tbl := array.NewTableFromRecords(recs[0].Schema(), recs)
	defer tbl.Release()
	cols := make([]arrow.Array, tbl.NumCols())
	for i := range cols {
		a, err := array.Concatenate(tbl.Column(i).Data().Chunks(), mem)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Release()
		cols[i] = a
	}
	return array.NewRecordBatch(tbl.Schema(), cols, tbl.NumRows())
}

// checkFooter compares what readers learn from the footers: key-value
// metadata, and per column the min/max statistics and null counts that
// engines prune row groups with (the files have one row group each when
// the row group is large).
func checkFooter(t *testing.T, native, ref []byte) {
	t.Helper()
	open := func(b []byte) *metadata.FileMetaData {
		r, err := file.NewParquetReader(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		return r.MetaData()
	}
	nm, rm := open(native), open(ref)
	for _, k := range []string{"k", "late", "ARROW:schema"} {
		a, b := nm.KeyValueMetadata().FindValue(k), rm.KeyValueMetadata().FindValue(k)
		if a == nil || b == nil || *a != *b {
			t.Fatalf("metadata %q: native %v, reference %v", k, a, b)
		}
	}
	if nm.NumRows != rm.NumRows || nm.NumRowGroups() != rm.NumRowGroups() && rm.NumRowGroups() == 1 {
		t.Fatalf("native %d rows in %d row groups, reference %d in %d", nm.NumRows, nm.NumRowGroups(), rm.NumRows, rm.NumRowGroups())
	}
	if nm.NumRowGroups() != 1 || rm.NumRowGroups() != 1 {
		return
	}
	nrg, rrg := nm.RowGroup(0), rm.RowGroup(0)
	for c := 0; c < nm.Schema.NumColumns(); c++ {
		nc, _ := nrg.ColumnChunk(c)
		rc, _ := rrg.ColumnChunk(c)
		if nc.NumValues() != rc.NumValues() {
			t.Errorf("column %s: %d values, reference %d", nc.PathInSchema(), nc.NumValues(), rc.NumValues())
		}
		if nm.Schema.Column(c).MaxRepetitionLevel() > 0 {
			continue // nested: the native writer keeps no statistics
		}
		ns, err1 := nc.StatsSet()
		rs, err2 := rc.StatsSet()
		if err1 != nil || err2 != nil || ns != rs {
			t.Errorf("column %s: statistics set %v, reference %v", nc.PathInSchema(), ns, rs)
			continue
		}
		if !ns {
			continue
		}
		a, _ := nc.Statistics()
		b, _ := rc.Statistics()
		if a.NullCount() != b.NullCount() || a.HasMinMax() != b.HasMinMax() {
			t.Errorf("column %s: nulls %d min/max %v, reference %d %v", nc.PathInSchema(), a.NullCount(), a.HasMinMax(), b.NullCount(), b.HasMinMax())
			continue
		}
		if a.HasMinMax() && (!bytes.Equal(a.EncodeMin(), b.EncodeMin()) || !bytes.Equal(a.EncodeMax(), b.EncodeMax())) {
			t.Errorf("column %s: min/max %x/%x, reference %x/%x", nc.PathInSchema(), a.EncodeMin(), a.EncodeMax(), b.EncodeMin(), b.EncodeMax())
		}
	}
}

// Statistics at the edges agree with the reference writer: zeros of both
// signs, NaN only, all null, one value.
func TestNativeStatsEdgeCases(t *testing.T) {
	sc := arrow.NewSchema([]arrow.Field{
		{Name: "zeros", Type: arrow.PrimitiveTypes.Float64},
		{Name: "nans", Type: arrow.PrimitiveTypes.Float64, Nullable: true},
		{Name: "nulls", Type: arrow.BinaryTypes.String, Nullable: true},
		{Name: "flags", Type: arrow.FixedWidthTypes.Boolean},
		{Name: "small", Type: arrow.PrimitiveTypes.Int32},
		{Name: "blob", Type: arrow.BinaryTypes.Binary, Nullable: true},
		{Name: "at", Type: &arrow.TimestampType{Unit: arrow.Millisecond}},
		{Name: "long", Type: arrow.BinaryTypes.String}, // min/max over 4 KiB are left out
	}, nil)
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	b := array.NewRecordBuilder(mem, sc)
	defer b.Release()
	b.Field(0).(*array.Float64Builder).AppendValues([]float64{0, math.Copysign(0, -1), 0}, nil)
	b.Field(1).(*array.Float64Builder).AppendValues([]float64{math.NaN(), 0, math.NaN()}, []bool{true, false, true})
	b.Field(2).AppendNulls(3)
	b.Field(3).(*array.BooleanBuilder).AppendValues([]bool{true, true, true}, nil)
	b.Field(4).(*array.Int32Builder).AppendValues([]int32{-3, 5, -3}, nil)
	b.Field(5).(*array.BinaryBuilder).AppendValues([][]byte{{0xff, 0}, nil, {}}, []bool{true, false, true})
	b.Field(6).(*array.TimestampBuilder).AppendValues([]arrow.Timestamp{-1, 1 << 40, 0}, nil)
	b.Field(7).(*array.StringBuilder).AppendValues([]string{strings.Repeat("a", 5000), "b", strings.Repeat("c", 5001)}, nil)
	rec := b.NewRecordBatch()
	defer rec.Release()
	native := writeAll(t, sc, Options{}, []arrow.RecordBatch{rec})
	ref := writeAll(t, sc, Options{Reference: true}, []arrow.RecordBatch{rec})
	checkFooter(t, native, ref)
	got, want := concat(t, mem, readAll(t, native, mem)), concat(t, mem, readAll(t, ref, mem))
	defer got.Release()
	defer want.Release()
	if !array.RecordApproxEqual(got, want, array.WithNaNsEqual(true)) {
		t.Fatalf("native and reference files differ:\nnative %v\nref    %v", got, want)
	}
}

// The frames written by hand, of raw blocks and of Huffman-coded literal
// blocks, decode with zstd's own decoder and arrow-go's codec to what went
// in, at every block boundary, for data Huffman shrinks and data it
// cannot.
func TestStoredZstdFrames(t *testing.T) {
	codec, err := compress.GetCodec(compress.Codecs.Zstd)
	if err != nil {
		t.Fatal(err)
	}
	dec, err := zstd.NewReader(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	rng := rand.New(rand.NewSource(1))
	var huff huff0.Scratch
	for _, n := range []int{0, 1, 1023, 1024, 128<<10 - 1, 128 << 10, 128<<10 + 1, 1<<20 + 3} {
		for _, kind := range []string{"random", "skewed", "constant"} {
			src := make([]byte, n)
			for i := range src {
				switch kind {
				case "random":
					src[i] = byte(rng.Intn(256))
				case "skewed":
					src[i] = byte(rng.ExpFloat64() * 3)
				}
			}
			for mode, frame := range map[string][]byte{
				"stored":   appendStoredZstd([]byte("prefix"), src)[len("prefix"):],
				"literals": appendLiteralsZstd([]byte("prefix"), src, &huff)[len("prefix"):],
			} {
				got, err := dec.DecodeAll(frame, nil)
				if err != nil || !bytes.Equal(got, src) {
					t.Fatalf("%s %d %s bytes: zstd decoded %d bytes, %v", mode, n, kind, len(got), err)
				}
				if got := codec.Decode(make([]byte, n), frame); !bytes.Equal(got, src) {
					t.Fatalf("%s %d %s bytes: arrow-go's codec decoded %d bytes", mode, n, kind, len(got))
				}
				if mode == "literals" && kind == "skewed" && n >= 1024 && len(frame) > n/2 {
					t.Fatalf("%d skewed bytes: literals frame of %d bytes", n, len(frame))
				}
			}
		}
	}
}

// Each column's pages get the encoding and compression that suit them:
// raw-block frames for random 32-bit words (nothing shrinks them),
// DELTA_BINARY_PACKED for random token ids (19 bits each; zstd's matches do
// not pay there), the zstd encoder for long runs; all read back the same.
func TestIncompressiblePagesStored(t *testing.T) {
	sc := arrow.NewSchema([]arrow.Field{
		{Name: "noise", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Int32)},
		{Name: "zeros", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Int32)},
		{Name: "ids", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Int32)},
	}, nil)
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	b := array.NewRecordBuilder(mem, sc)
	defer b.Release()
	rng := rand.New(rand.NewSource(2))
	noise, zeros, ids := b.Field(0).(*array.ListBuilder), b.Field(1).(*array.ListBuilder), b.Field(2).(*array.ListBuilder)
	for r := 0; r < 400; r++ {
		noise.Append(true)
		zeros.Append(true)
		ids.Append(true)
		for k := 0; k < 4096; k++ {
			noise.ValueBuilder().(*array.Int32Builder).Append(int32(rng.Uint32()))
			zeros.ValueBuilder().(*array.Int32Builder).Append(0)
			ids.ValueBuilder().(*array.Int32Builder).Append(int32(rng.Intn(151000)))
		}
	}
	rec := b.NewRecordBatch()
	defer rec.Release()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, sc, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(rec); err != nil {
		t.Fatal(err)
	}
	if m := []pageMode{w.nw.leaves[0].mode.mode, w.nw.leaves[1].mode.mode, w.nw.leaves[2].mode.mode}; m[0] != modeStored || m[1] != modeZstd || m[2] != modeDelta {
		t.Fatalf("modes of noise, zeros, ids: %v, want stored, zstd, delta", m)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	r := readBackEqual(t, buf.Bytes(), rec)
	defer r.Close()
	var size [3]int64 // per column, over the row groups
	for g := 0; g < r.NumRowGroups(); g++ {
		for c := range size {
			cc, err := r.MetaData().RowGroup(g).ColumnChunk(c)
			if err != nil {
				t.Fatal(err)
			}
			size[c] += cc.TotalCompressedSize()
		}
	}
	raw := int64(400 * 4096 * 4)
	if size[0] < raw || size[1] > raw/100 || size[2] > raw*61/100 {
		t.Fatalf("noise %d bytes, zeros %d, ids %d, of %d raw", size[0], size[1], size[2], raw)
	}
}

// Pages whose levels outgrow the room kept for them before the values
// (many short lists: two level runs per row) read back the same as pages
// whose levels fit.
func TestNativeLevelsOutgrowGap(t *testing.T) {
	sc := arrow.NewSchema([]arrow.Field{{Name: "pairs", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Int32)}}, nil)
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	b := array.NewRecordBuilder(mem, sc)
	defer b.Release()
	lb := b.Field(0).(*array.ListBuilder)
	for r := 0; r < 200000; r++ {
		lb.Append(true)
		lb.ValueBuilder().(*array.Int32Builder).AppendValues([]int32{int32(r), -int32(r)}, nil)
	}
	rec := b.NewRecordBatch()
	defer rec.Release()
	data := writeAll(t, sc, Options{}, []arrow.RecordBatch{rec})
	got := concat(t, mem, readAll(t, data, mem))
	defer got.Release()
	if !array.RecordEqual(got, rec) {
		t.Fatal("read back differs")
	}
}

// DELTA_BINARY_PACKED pages read back through arrow-go's decoder, on the
// edges of the encoding: lists of 0, 1, 2, 127 to 129 and 257 values
// (blocks and miniblocks cut anywhere, padding), equal values (width 0),
// the extremes of int32 (deltas that wrap), a nullable column, and pages
// cut inside lists.
func TestDeltaPagesReadBack(t *testing.T) {
	sc := arrow.NewSchema([]arrow.Field{
		{Name: "ids", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Int32)},
		{Name: "n", Type: arrow.PrimitiveTypes.Int32, Nullable: true},
	}, nil)
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	b := array.NewRecordBuilder(mem, sc)
	defer b.Release()
	rng := rand.New(rand.NewSource(4))
	ids, n := b.Field(0).(*array.ListBuilder), b.Field(1).(*array.Int32Builder)
	vb := ids.ValueBuilder().(*array.Int32Builder)
	lengths := []int{0, 1, 2, 127, 128, 129, 130, 257, 31, 32, 33}
	for r := 0; r < 20000; r++ { // the flat column's pages reach probeBytes too
		ids.Append(true)
		length := lengths[r%len(lengths)]
		if r%50 == 0 {
			length = rng.Intn(2000)
		}
		kind := rng.Intn(4)
		for k := 0; k < length; k++ {
			switch kind {
			case 0:
				vb.Append(int32(rng.Intn(151000)))
			case 1:
				vb.Append(7) // width 0
			case 2:
				vb.Append([]int32{math.MinInt32, math.MaxInt32, 0, -1, 1}[rng.Intn(5)])
			default:
				vb.Append(int32(rng.Uint32()))
			}
		}
		if r%5 == 0 {
			n.AppendNull()
		} else {
			n.Append(int32(rng.Uint32()))
		}
	}
	rec := b.NewRecordBatch()
	defer rec.Release()
	roundTripInMode(t, sc, rec, modeDelta, pq.Encodings.DeltaBinaryPacked)
}

// readBackEqual reads data through arrow-go, fails t unless the values
// are rec's, and opens the file for its metadata. It reads with an
// unchecked allocator: arrow-go's DELTA_BINARY_PACKED decoder never frees
// its 64-byte miniblock-widths buffer (v18.8.0,
// deltaBitPackDecoder.initBlock); the Go allocator lets the GC have it.
func readBackEqual(t *testing.T, data []byte, rec arrow.RecordBatch) *file.Reader {
	t.Helper()
	mem := memory.NewGoAllocator()
	got := concat(t, mem, readAll(t, data, mem))
	defer got.Release()
	if !array.RecordEqual(got, rec) {
		t.Fatal("read back differs")
	}
	r, err := file.NewParquetReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// roundTripInMode writes rec with every page of at least probeBytes in
// mode (pages of 64 KiB: many, cut inside lists), reads it back through
// arrow-go's decoders, and checks that the values are the same and that
// the first column chunk lists enc.
func roundTripInMode(t *testing.T, sc *arrow.Schema, rec arrow.RecordBatch, mode pageMode, enc pq.Encoding) {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, sc, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range w.nw.leaves {
		l.mode = &columnMode{mode: mode, left: 1 << 30}
	}
	w.nw.pageSize = 64 << 10
	if err := w.Write(rec); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	r := readBackEqual(t, buf.Bytes(), rec)
	defer r.Close()
	cc, err := r.MetaData().RowGroup(0).ColumnChunk(0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(cc.Encodings(), enc) {
		t.Fatalf("column chunk encodings %v: %v missing", cc.Encodings(), enc)
	}
}

// DELTA_BYTE_ARRAY pages read back through arrow-go's decoder: values
// that repeat their predecessor whole, in part, or not at all, empty
// ones, nulls, long ones, binary bytes, and pages cut anywhere.
func TestFrontCodedPagesReadBack(t *testing.T) {
	sc := arrow.NewSchema([]arrow.Field{
		{Name: "messages", Type: arrow.BinaryTypes.String, Nullable: true},
		{Name: "blob", Type: arrow.BinaryTypes.Binary},
	}, nil)
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	b := array.NewRecordBuilder(mem, sc)
	defer b.Release()
	rng := rand.New(rand.NewSource(5))
	msgs, blob := b.Field(0).(*array.StringBuilder), b.Field(1).(*array.BinaryBuilder)
	var conv string
	for r := 0; r < 20000; r++ {
		switch rng.Intn(6) {
		case 0:
			conv = "" // a new conversation
		case 1:
			conv = conv[:rng.Intn(len(conv)+1)] // shares a part
		}
		conv += fmt.Sprintf(`{"role":"user","content":"%d %s"}`, r, strings.Repeat("x", rng.Intn(300)))
		switch rng.Intn(10) {
		case 0:
			msgs.AppendNull()
		case 1:
			msgs.Append("")
		default:
			msgs.Append(conv)
		}
		v := make([]byte, rng.Intn(40))
		rng.Read(v)
		blob.Append(v)
	}
	rec := b.NewRecordBatch()
	defer rec.Release()
	roundTripInMode(t, sc, rec, modeFront, pq.Encodings.DeltaByteArray)
}

// Probes thin out while a column's mode holds (16, 32, ... up to 256
// pages apart) and come back every 16 pages once it changes: a column
// whose content turns from random ids to zeros is zstd-compressed within
// probeMax pages.
func TestProbesBackOff(t *testing.T) {
	sc := arrow.NewSchema([]arrow.Field{{Name: "ids", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Int32)}}, nil)
	w, err := NewWriter(io.Discard, sc, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	rng := rand.New(rand.NewSource(6))
	ids, zeros := make([]int32, 32<<10), make([]int32, 32<<10)
	for i := range ids {
		ids[i] = int32(rng.Intn(151000))
	}
	l := w.nw.leaves[0]
	page := func(v []int32) pageMode {
		w.nw.compressPage(l, appendPlain(nil, v), 0)
		return l.mode.mode
	}
	for range 1000 {
		if m := page(ids); m != modeDelta {
			t.Fatalf("random ids: mode %v, want delta", m)
		}
	}
	// 1 + 16 + 32 + 64 + 128 + 256 + 256 + 256 pages: 8 probes.
	if p := l.mode.probes; p < 7 || p > 9 {
		t.Fatalf("%d probes in 1000 pages, want 8", p)
	}
	switched, every := -1, 0
	for i := range 2 * probeMax {
		if page(zeros) == modeZstd && switched < 0 {
			switched, every = i, l.mode.every
		}
	}
	if switched < 0 || switched > probeMax {
		t.Fatalf("zeros compressed with zstd after %d pages, want at most %d", switched, probeMax)
	}
	if every != probeEvery {
		t.Fatalf("probe interval %d after the change, want %d", every, probeEvery)
	}
}

// Compact entropy-codes the literals of zstd pages: smaller shards that
// read back the same as the default's raw literals.
func TestCompactLiterals(t *testing.T) {
	sc := arrow.NewSchema([]arrow.Field{{Name: "prompt", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Int32)}}, nil)
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	b := array.NewRecordBuilder(mem, sc)
	defer b.Release()
	rng := rand.New(rand.NewSource(7))
	lb := b.Field(0).(*array.ListBuilder)
	vb := lb.ValueBuilder().(*array.Int32Builder)
	var prompt []int32
	for r := 0; r < 3000; r++ { // prompts that grow by new random tokens: matches and literals
		if r%4 == 0 {
			prompt = prompt[:0]
		}
		for k := 0; k < 200; k++ {
			prompt = append(prompt, int32(rng.Intn(151000)))
		}
		lb.Append(true)
		vb.AppendValues(prompt, nil)
	}
	rec := b.NewRecordBatch()
	defer rec.Release()
	var sizes [2]int
	for i, compact := range []bool{false, true} {
		var buf bytes.Buffer
		w, err := NewWriter(&buf, sc, Options{Compact: compact}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Write(rec); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if m := w.nw.leaves[0].mode.mode; m != modeZstd {
			t.Fatalf("compact %v: mode %v, want zstd", compact, m)
		}
		got := concat(t, mem, readAll(t, buf.Bytes(), mem))
		if !array.RecordEqual(got, rec) {
			t.Fatalf("compact %v: read back differs", compact)
		}
		got.Release()
		sizes[i] = buf.Len()
	}
	if sizes[1] >= sizes[0]*9/10 {
		t.Fatalf("compact %d bytes, default %d: want at least 10%% smaller", sizes[1], sizes[0])
	}
}

// The same records make the same file, byte for byte, with pages of two
// encodings in a chunk (the footer's encoding stats come from a map).
func TestSameInputSameFile(t *testing.T) {
	sc := arrow.NewSchema([]arrow.Field{{Name: "ids", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Int32)}}, nil)
	mem := memory.NewGoAllocator()
	b := array.NewRecordBuilder(mem, sc)
	defer b.Release()
	rng := rand.New(rand.NewSource(8))
	lb := b.Field(0).(*array.ListBuilder)
	for r := 0; r < 300; r++ { // 70 KiB pages in delta, then a short PLAIN one
		lb.Append(true)
		for k := 0; k < 250; k++ {
			lb.ValueBuilder().(*array.Int32Builder).Append(int32(rng.Intn(151000)))
		}
	}
	rec := b.NewRecordBatch()
	defer rec.Release()
	var first []byte
	for i := 0; i < 20; i++ {
		var buf bytes.Buffer
		w, err := NewWriter(&buf, sc, Options{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		w.nw.leaves[0].mode = &columnMode{mode: modeDelta, left: 1 << 30}
		w.nw.pageSize = 70 << 10
		if err := w.Write(rec); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = buf.Bytes()
		} else if !bytes.Equal(buf.Bytes(), first) {
			t.Fatalf("write %d differs from the first", i)
		}
	}
}
