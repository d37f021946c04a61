package compare

import (
	"bytes"
	"context"
	"fmt"
	"io"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	pq "github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
	pgo "github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/compress/uncompressed"
	"github.com/parquet-go/parquet-go/compress/zstd"

	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/ingest"
)

// Row is one step in the columns that carry a shard's bytes and most of
// its encoding time: ids, token lists, logprobs, messages, and two
// scalars. The Parquet comparison writes these columns; the remaining
// shard columns are small scalars every writer encodes alike.
type Row struct {
	StepID           string    `parquet:"step_id"`
	PolicyVersion    int64     `parquet:"policy_version"`
	Advantage        float64   `parquet:"advantage"`
	PromptIDs        []int32   `parquet:"prompt_ids,list"`
	ResponseIDs      []int32   `parquet:"response_ids,list"`
	ResponseLogprobs []float32 `parquet:"response_logprobs,list"`
	Messages         *string   `parquet:"messages,optional"`
}

// RowSchema is Row as Arrow, with StepSchema's types.
var RowSchema = arrow.NewSchema([]arrow.Field{
	{Name: "step_id", Type: arrow.BinaryTypes.String},
	{Name: "policy_version", Type: arrow.PrimitiveTypes.Int64},
	{Name: "advantage", Type: arrow.PrimitiveTypes.Float64},
	{Name: "prompt_ids", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Int32)},
	{Name: "response_ids", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Int32)},
	{Name: "response_logprobs", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Float32)},
	{Name: "messages", Type: arrow.BinaryTypes.String, Nullable: true},
}, nil)

// Rows decodes the steps of data (JSON lines) into Rows, in order;
// advantage is a stand-in value per row (the writers only encode it).
func Rows(data []byte) ([]Row, error) {
	var rows []Row
	err := DecodeOurs(data, func(r ingest.Record) {
		if s := r.Step; s != nil {
			row := Row{StepID: s.StepID, PolicyVersion: s.PolicyVersion, Advantage: float64(len(rows)%17)/8 - 1,
				PromptIDs: s.PromptIDs, ResponseIDs: s.ResponseIDs, ResponseLogprobs: s.ResponseLogprobs}
			if s.Messages != nil {
				m := string(s.Messages)
				row.Messages = &m
			}
			rows = append(rows, row)
		}
	})
	return rows, err
}

// ArrowRecords lays rows out as Arrow record batches of up to batch rows
// (the pipeline's 2048-row batches).
func ArrowRecords(rows []Row, batch int) []arrow.RecordBatch {
	b := array.NewRecordBuilder(memory.DefaultAllocator, RowSchema)
	defer b.Release()
	var out []arrow.RecordBatch
	for i, r := range rows {
		b.Field(0).(*array.StringBuilder).Append(r.StepID)
		b.Field(1).(*array.Int64Builder).Append(r.PolicyVersion)
		b.Field(2).(*array.Float64Builder).Append(r.Advantage)
		for j, ids := range [][]int32{r.PromptIDs, r.ResponseIDs} {
			lb := b.Field(3 + j).(*array.ListBuilder)
			lb.Append(true)
			lb.ValueBuilder().(*array.Int32Builder).AppendValues(ids, nil)
		}
		lb := b.Field(5).(*array.ListBuilder)
		lb.Append(true)
		lb.ValueBuilder().(*array.Float32Builder).AppendValues(r.ResponseLogprobs, nil)
		if r.Messages != nil {
			b.Field(6).(*array.StringBuilder).Append(*r.Messages)
		} else {
			b.Field(6).AppendNull()
		}
		if (i+1)%batch == 0 || i == len(rows)-1 {
			out = append(out, b.NewRecordBatch())
		}
	}
	return out
}

// WriteOurs writes recs with the native page writer (connectors/parquet,
// default options but compact, --compact: it picks each column's
// encoding on probe pages; compact entropy-codes zstd literals, as the
// libraries' zstd always does).
func WriteOurs(w io.Writer, recs []arrow.RecordBatch, compact bool) error {
	pw, err := parquet.NewWriter(w, RowSchema, parquet.Options{Compact: compact}, nil)
	if err != nil {
		return err
	}
	for _, r := range recs {
		if err := pw.Write(r); err != nil {
			return err
		}
	}
	return pw.Close()
}

// The encodings the native writer picks on these rows, given to the
// libraries: token ids of prompts PLAIN with zstd (level 1), of responses
// DELTA_BINARY_PACKED without compression (the native writer stores them
// in raw zstd blocks), logprobs PLAIN without compression (likewise),
// messages DELTA_BYTE_ARRAY with zstd, scalars PLAIN with zstd; no
// dictionaries, no statistics on the lists, 1 MiB pages, 8 MiB row groups.

// WritePqarrow writes recs with arrow-go's pqarrow writer in buffered row
// groups cut at 8 MiB.
func WritePqarrow(w io.Writer, recs []arrow.RecordBatch) error {
	props := pq.NewWriterProperties(
		pq.WithCompression(compress.Codecs.Zstd), pq.WithCompressionLevel(1),
		pq.WithDictionaryDefault(false), pq.WithDataPageSize(1<<20), pq.WithMaxRowGroupLength(1<<30),
		pq.WithStats(true),
		pq.WithStatsFor("prompt_ids.list.element", false), pq.WithStatsFor("response_ids.list.element", false),
		pq.WithStatsFor("response_logprobs.list.element", false), pq.WithStatsFor("messages", false),
		pq.WithEncodingFor("response_ids.list.element", pq.Encodings.DeltaBinaryPacked),
		pq.WithCompressionFor("response_ids.list.element", compress.Codecs.Uncompressed),
		pq.WithCompressionFor("response_logprobs.list.element", compress.Codecs.Uncompressed),
		pq.WithEncodingFor("messages", pq.Encodings.DeltaByteArray),
	)
	fw, err := pqarrow.NewFileWriter(RowSchema, w, props, pqarrow.NewArrowWriterProperties(pqarrow.WithStoreSchema()))
	if err != nil {
		return err
	}
	for _, r := range recs {
		if fw.RowGroupTotalCompressedBytes()+fw.RowGroupTotalBytesWritten() >= 8<<20 {
			if err := fw.NewBufferedRowGroupChecked(); err != nil {
				return err
			}
		}
		if err := fw.WriteBuffered(r); err != nil {
			return err
		}
	}
	return fw.Close()
}

// pgoSchema is Row's Parquet schema for parquet-go with the encodings and
// codecs above.
var pgoSchema = func() *pgo.Schema {
	z := &zstd.Codec{Level: zstd.SpeedFastest}
	raw := &uncompressed.Codec{}
	return pgo.NewSchema("row", pgo.Group{
		"step_id":           pgo.Compressed(pgo.String(), z),
		"policy_version":    pgo.Compressed(pgo.Int(64), z),
		"advantage":         pgo.Compressed(pgo.Leaf(pgo.DoubleType), z),
		"prompt_ids":        pgo.List(pgo.Compressed(pgo.Int(32), z)),
		"response_ids":      pgo.List(pgo.Compressed(pgo.Encoded(pgo.Int(32), &pgo.DeltaBinaryPacked), raw)),
		"response_logprobs": pgo.List(pgo.Compressed(pgo.Leaf(pgo.FloatType), raw)),
		"messages":          pgo.Optional(pgo.Compressed(pgo.Encoded(pgo.String(), &pgo.DeltaByteArray), z)),
	})
}()

// WriteParquetGo writes rows with parquet-go's GenericWriter (from Go
// values, its fast path: no Arrow conversion is timed) in row groups cut
// at 8 MiB of buffered pages.
func WriteParquetGo(w io.Writer, rows []Row) error {
	pw := pgo.NewGenericWriter[Row](w, pgoSchema, pgo.PageBufferSize(1<<20), pgo.DataPageStatistics(false))
	const step = 2048
	var cut int64 // Size at the last row group cut
	for i := 0; i < len(rows); i += step {
		if _, err := pw.Write(rows[i:min(i+step, len(rows))]); err != nil {
			return err
		}
		if pw.Size()-cut >= 8<<20 {
			if err := pw.Flush(); err != nil {
				return err
			}
			cut = pw.Size()
		}
	}
	return pw.Close()
}

// ReadRows reads a Parquet file (any of the three) back through
// connectors/parquet's reader into Rows, in file order.
func ReadRows(file []byte) ([]Row, error) {
	rd, err := parquet.Open(context.Background(), "cmp", bytes.NewReader(file), nil, memory.DefaultAllocator)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	var rows []Row
	for {
		rec, err := rd.Next()
		if err == io.EOF {
			return rows, nil
		}
		if err != nil {
			return nil, err
		}
		col := func(name string) arrow.Array {
			idx := rec.Schema().FieldIndices(name)
			if len(idx) != 1 {
				err = fmt.Errorf("no column %s", name)
				return nil
			}
			return rec.Column(idx[0])
		}
		sid, pv, adv := col("step_id"), col("policy_version"), col("advantage")
		pr, rs, lp, ms := col("prompt_ids"), col("response_ids"), col("response_logprobs"), col("messages")
		if err != nil {
			return nil, err
		}
		for i := 0; i < int(rec.NumRows()); i++ {
			r := Row{
				StepID:        sid.(*array.String).Value(i),
				PolicyVersion: pv.(*array.Int64).Value(i),
				Advantage:     adv.(*array.Float64).Value(i),
				PromptIDs:     listInt32(pr, i), ResponseIDs: listInt32(rs, i),
			}
			l := lp.(*array.List)
			lo, hi := l.ValueOffsets(i)
			r.ResponseLogprobs = append([]float32{}, l.ListValues().(*array.Float32).Float32Values()[lo:hi]...)
			if ms.IsValid(i) {
				m := ms.(*array.String).Value(i)
				r.Messages = &m
			}
			rows = append(rows, r)
		}
	}
}

func listInt32(a arrow.Array, i int) []int32 {
	l := a.(*array.List)
	lo, hi := l.ValueOffsets(i)
	return append([]int32{}, l.ListValues().(*array.Int32).Int32Values()[lo:hi]...)
}
