package parquet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"

	"github.com/rllm-pipe/rllm-pipe/schemas/prefix"
)

// ReadFile calls fn with record batches of the named columns of the
// Parquet file at path (all columns when columns is empty). Batches are
// released after fn returns; fn must Retain what it keeps.
func ReadFile(ctx context.Context, path string, columns []string, mem memory.Allocator, fn func(arrow.RecordBatch) error) error {
	rd, err := OpenFile(ctx, path, columns, mem)
	if err != nil {
		return err
	}
	defer rd.Close()
	return rd.Each(fn)
}

// Each calls fn with every record batch left, each released after fn
// returns (fn must Retain what it keeps), until the end or an error.
func (r *Reader) Each(fn func(arrow.RecordBatch) error) error {
	for {
		rec, err := r.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := fn(rec); err != nil {
			return err
		}
	}
}

// Reader pulls record batches from one Parquet file. A shard whose
// prompts are stored as prefix deltas (schema 4) is read with whole
// prompt_ids and messages (schemas/prefix): every reader sees the
// prompts the steps were sent with.
type Reader struct {
	name   string
	pf     *file.Reader
	rr     pqarrow.RecordReader
	expand *prefix.Expander
	asked  int // the columns asked for come first; the rest were added
	cur    arrow.RecordBatch
}

// OpenFile opens the Parquet file at path for reading the named columns
// (all when columns is empty).
func OpenFile(ctx context.Context, path string, columns []string, mem memory.Allocator) (*Reader, error) {
	pf, err := file.OpenParquetFile(path, false, file.WithReadProps(nil))
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return newReader(ctx, path, pf, columns, mem, true)
}

// Open reads a Parquet file from r (for instance a downloaded object);
// name is used in errors.
func Open(ctx context.Context, name string, r parquet.ReaderAtSeeker, columns []string, mem memory.Allocator) (*Reader, error) {
	pf, err := file.NewParquetReader(r)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	return newReader(ctx, name, pf, columns, mem, true)
}

// OpenStored is Open without rebuilding prompts: rows as stored, deltas
// and all (tools that measure the layout, tests of the encoding).
func OpenStored(ctx context.Context, name string, r parquet.ReaderAtSeeker, columns []string, mem memory.Allocator) (*Reader, error) {
	pf, err := file.NewParquetReader(r)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	return newReader(ctx, name, pf, columns, mem, false)
}

func newReader(ctx context.Context, name string, pf *file.Reader, columns []string, mem memory.Allocator, expand bool) (*Reader, error) {
	fr, err := pqarrow.NewFileReader(pf, pqarrow.ArrowReadProperties{BatchSize: 8192}, mem)
	if err != nil {
		pf.Close()
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	sc, err := fr.Schema()
	if err != nil {
		pf.Close()
		return nil, fmt.Errorf("schema of %s: %w", name, err)
	}
	hasDeltas := len(sc.FieldIndices("prompt_prefix_len")) > 0
	deltas := expand && hasDeltas
	if !hasDeltas {
		// A shard written before prefix deltas has whole prompts: the
		// delta columns asked for are left out.
		columns = slices.DeleteFunc(slices.Clone(columns), func(c string) bool {
			return c == "prompt_prefix_len" || c == "prompt_delta_ids" || c == "messages_delta"
		})
	}
	asked := len(columns)
	var idx []int
	if len(columns) > 0 {
		if deltas {
			columns = prefix.Columns(columns)
		}
		for _, c := range columns {
			fi := sc.FieldIndices(c)
			if len(fi) == 0 {
				pf.Close()
				return nil, fmt.Errorf("%s has no column %q", name, c)
			}
			// Map the Arrow field to its Parquet leaf columns.
			leaves, err := leafIndices(fr, fi[0])
			if err != nil {
				pf.Close()
				return nil, err
			}
			idx = append(idx, leaves...)
		}
	}
	rr, err := fr.GetRecordReader(ctx, idx, nil)
	if err != nil {
		pf.Close()
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	r := &Reader{name: name, pf: pf, rr: rr, asked: asked}
	if deltas {
		r.expand = prefix.NewExpander(mem)
	}
	return r, nil
}

// KeepDeltas makes the reader return rows as stored from the next call
// to Next on: prompts stored as prefix deltas stay deltas (prompt_ids
// null, prompt_prefix_len and prompt_delta_ids set), for readers that work
// on the deltas themselves (train/merge). Only the columns asked for are
// returned; ask for the delta columns to see them.
func (r *Reader) KeepDeltas() { r.expand = nil }

// Next returns the next record batch, valid until the following call to
// Next or Close (Retain it to keep it), or io.EOF after the last.
func (r *Reader) Next() (arrow.RecordBatch, error) {
	if r.cur != nil {
		r.cur.Release()
		r.cur = nil
	}
	if r.rr.Next() {
		rec := r.rr.RecordBatch()
		whole := rec
		if r.expand != nil {
			var err error
			if whole, err = r.expand.Expand(rec); err != nil {
				return nil, fmt.Errorf("read %s: %w", r.name, err)
			}
		} else if r.asked == 0 || int(rec.NumCols()) <= r.asked {
			return rec, nil
		} else {
			rec.Retain()
		}
		if r.asked > 0 && int(whole.NumCols()) > r.asked {
			// Drop the columns read only to rebuild the prompts.
			all := whole
			whole = array.NewRecordBatch(arrow.NewSchema(all.Schema().Fields()[:r.asked], nil), all.Columns()[:r.asked], all.NumRows())
			all.Release()
		}
		r.cur = whole
		return whole, nil
	}
	if err := r.rr.Err(); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read %s: %w", r.name, err)
	}
	return nil, io.EOF
}

// FooterValue is the value of key in the file's footer metadata.
func (r *Reader) FooterValue(key string) (string, bool) {
	kv := r.pf.MetaData().KeyValueMetadata()
	if kv == nil {
		return "", false
	}
	v := kv.FindValue(key)
	if v == nil {
		return "", false
	}
	return *v, true
}

// Close releases the reader and closes the file.
func (r *Reader) Close() error {
	if r.cur != nil {
		r.cur.Release()
		r.cur = nil
	}
	r.rr.Release()
	return r.pf.Close()
}

func leafIndices(fr *pqarrow.FileReader, field int) ([]int, error) {
	m := fr.Manifest
	if field >= len(m.Fields) {
		return nil, fmt.Errorf("field %d out of range", field)
	}
	var out []int
	var walk func(f pqarrow.SchemaField)
	walk = func(f pqarrow.SchemaField) {
		if f.IsLeaf() {
			out = append(out, f.ColIndex)
			return
		}
		for _, c := range f.Children {
			walk(c)
		}
	}
	walk(m.Fields[field])
	return out, nil
}
