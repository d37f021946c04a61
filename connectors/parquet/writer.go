// Package parquet encodes Arrow record batches of schemas.StepSchema into
// Parquet files and reads them back: zstd, row groups cut by size, no
// dictionary or statistics on token and logprob lists, microsecond
// timestamps. Schemas of flat, list and map columns (StepSchema among
// them) are written by a native encoder straight from Arrow buffers
// (native.go); others, and Options.Reference, use arrow-go's pqarrow.
// It is the only package of rllm-pipe that imports pqarrow.
package parquet

import (
	"fmt"
	"io"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/memory"
	pq "github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
)

// Options tune the encoding. Zero values take the defaults noted.
type Options struct {
	// RowGroupBytes cuts a row group once its compressed size reaches
	// this. Default 8 MiB: an open shard buffers one row group, and a
	// smaller working set spares the GC (docs/performance.md#choices-behind-the-defaults).
	RowGroupBytes int64
	// ZstdLevel is the zstd level. Default 1 (see the benchmarks).
	ZstdLevel int
	// Compact has zstd entropy-code the literals of the pages its encoder
	// compresses (prompts, messages, small columns). Off, literals are left
	// raw: shards somewhat larger for less ingest CPU, and faster to
	// decode (docs/performance.md#choices-behind-the-defaults). The native encoder only.
	Compact   bool
	Allocator memory.Allocator
	// Reference writes with arrow-go's pqarrow even where the native
	// encoder could: the slower reference path the native one is tested
	// against.
	Reference bool
}

// createdBy names the writer in every footer, in the "app version x.y.z"
// form: parquet-mr (Spark, Hive) ignores string statistics from writers
// whose created_by it cannot parse.
const createdBy = "rllm-pipe version 0.7.0"

// noDictionary lists the columns whose values are (nearly) unique per row,
// where a dictionary only costs time.
var noDictionary = []string{
	"prompt_ids.list.element", "response_ids.list.element", "response_logprobs.list.element",
	"token_versions.list.element", "teacher_logprobs.list.element",
	"messages", "metadata", "trajectory_metadata", "step_id", "source_line", "created_at",
}

// noStats lists the columns written without min/max statistics.
var noStats = []string{
	"prompt_ids.list.element", "response_ids.list.element", "response_logprobs.list.element",
	"token_versions.list.element", "teacher_logprobs.list.element", "token_advantages.list.element",
	"messages", "metadata", "trajectory_metadata",
}

// Writer writes one Parquet file. It is not safe for concurrent use.
type Writer struct {
	nw     *nativeWriter // nil: fw writes
	fw     *pqarrow.FileWriter
	cw     *countingWriter
	rgMax  int64
	closed bool
	direct bool // the last record was written as its own row group
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// NewWriter starts a Parquet file of schema on w. meta is stored in the
// file's key-value metadata.
func NewWriter(w io.Writer, schema *arrow.Schema, opts Options, meta map[string]string) (*Writer, error) {
	if opts.RowGroupBytes <= 0 {
		opts.RowGroupBytes = 8 << 20
	}
	if opts.ZstdLevel == 0 {
		opts.ZstdLevel = 1
	}
	if opts.Allocator == nil {
		opts.Allocator = memory.DefaultAllocator
	}
	cw := &countingWriter{w: w}
	if !opts.Reference {
		nw, err := newNativeWriter(cw, schema, opts, meta)
		if err != nil {
			return nil, err
		}
		if nw != nil {
			return &Writer{nw: nw, cw: cw, rgMax: opts.RowGroupBytes}, nil
		}
	}
	props := []pq.WriterProperty{
		pq.WithAllocator(opts.Allocator),
		pq.WithCompression(compress.Codecs.Zstd),
		pq.WithCompressionLevel(opts.ZstdLevel),
		pq.WithMaxRowGroupLength(1 << 30), // cut by bytes, below
		pq.WithDataPageSize(1 << 20),
		pq.WithCreatedBy(createdBy),
		pq.WithStats(true),
	}
	for _, c := range noDictionary {
		props = append(props, pq.WithDictionaryFor(c, false))
	}
	// Min/max statistics of token ids, logprobs and message text help no
	// reader (nobody prunes row groups by a token id) and cost encoding
	// time; the scalar columns keep theirs.
	for _, c := range noStats {
		props = append(props, pq.WithStatsFor(c, false))
	}
	fw, err := pqarrow.NewFileWriter(schema, cw, pq.NewWriterProperties(props...),
		pqarrow.NewArrowWriterProperties(pqarrow.WithAllocator(opts.Allocator), pqarrow.WithStoreSchema()))
	if err != nil {
		return nil, fmt.Errorf("parquet: new file writer: %w", err)
	}
	for k, v := range meta {
		if err := fw.AppendKeyValueMetadata(k, v); err != nil {
			return nil, fmt.Errorf("parquet: metadata %q: %w", k, err)
		}
	}
	return &Writer{fw: fw, cw: cw, rgMax: opts.RowGroupBytes}, nil
}

// Write adds rec to the file. rec stays owned by the caller. The native
// encoder takes its rows in windows of about a page and cuts a row group
// between windows once it reaches the row-group size. On the reference
// path a record of at least half a row group is written as a row group of
// its own, column by column straight to the output; smaller ones are
// gathered in a buffered row group, cut once it reaches the size.
func (w *Writer) Write(rec arrow.RecordBatch) error {
	if w.nw != nil {
		return w.nw.write(rec)
	}
	if RecordBytes(rec) >= w.rgMax/2 {
		if err := w.fw.Write(rec); err != nil {
			return fmt.Errorf("parquet: write: %w", err)
		}
		w.direct = true
		return nil
	}
	if w.direct || w.fw.RowGroupTotalCompressedBytes()+w.fw.RowGroupTotalBytesWritten() >= w.rgMax {
		if err := w.fw.NewBufferedRowGroupChecked(); err != nil {
			return fmt.Errorf("parquet: new row group: %w", err)
		}
		w.direct = false
	}
	if err := w.fw.WriteBuffered(rec); err != nil {
		return fmt.Errorf("parquet: write: %w", err)
	}
	return nil
}

// Flush writes out the row group being filled, the costly part of Close,
// which then writes only the footer. Writing may go on after it.
func (w *Writer) Flush() error {
	if w.nw != nil {
		return w.nw.flushRowGroup()
	}
	return nil // pqarrow writes its buffered row group at Close
}

// AddMetadata adds a key-value pair to the file footer; call before Close.
func (w *Writer) AddMetadata(k, v string) error {
	if w.nw != nil {
		return w.nw.addMetadata(k, v)
	}
	return w.fw.AppendKeyValueMetadata(k, v)
}

// Size estimates the file's final size: bytes flushed plus the row group
// still buffered (its compressed pages, and its open pages uncompressed).
func (w *Writer) Size() int64 {
	if w.nw != nil {
		return w.nw.size()
	}
	return w.cw.n + w.fw.RowGroupTotalCompressedBytes()
}

// Rows is the number of rows written.
func (w *Writer) Rows() int64 {
	if w.nw != nil {
		return w.nw.rows
	}
	return int64(w.fw.NumRows())
}

// Close writes the footer. It does not close the underlying writer. It is
// safe to call twice.
func (w *Writer) Close() error {
	if w.closed {
		return nil
	}
	w.closed = true
	if w.nw != nil {
		return w.nw.close()
	}
	if err := w.fw.Close(); err != nil {
		return fmt.Errorf("parquet: close: %w", err)
	}
	return nil
}

// Written is the number of bytes written to the underlying writer.
func (w *Writer) Written() int64 { return w.cw.n }

// RecordBytes is the size of rec's buffers (shared buffers of slices count
// whole: an upper bound).
func RecordBytes(rec arrow.RecordBatch) int64 {
	var n int64
	var walk func(d arrow.ArrayData)
	walk = func(d arrow.ArrayData) {
		for _, b := range d.Buffers() {
			if b != nil {
				n += int64(b.Len())
			}
		}
		for _, c := range d.Children() {
			walk(c)
		}
	}
	for _, c := range rec.Columns() {
		walk(c.Data())
	}
	return n
}
