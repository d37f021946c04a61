package parquet

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
)

// ReadFile calls fn with record batches of the named columns of the
// Parquet file at path (all columns when columns is empty). Batches are
// released after fn returns; fn must Retain what it keeps.
func ReadFile(ctx context.Context, path string, columns []string, mem memory.Allocator, fn func(arrow.RecordBatch) error) error {
	pf, err := file.OpenParquetFile(path, false, file.WithReadProps(nil))
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer pf.Close()
	fr, err := pqarrow.NewFileReader(pf, pqarrow.ArrowReadProperties{BatchSize: 8192}, mem)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	var idx []int
	if len(columns) > 0 {
		sc, err := fr.Schema()
		if err != nil {
			return fmt.Errorf("schema of %s: %w", path, err)
		}
		for _, c := range columns {
			fi := sc.FieldIndices(c)
			if len(fi) == 0 {
				return fmt.Errorf("%s has no column %q", path, c)
			}
			// Map the Arrow field to its Parquet leaf columns.
			leaves, err := leafIndices(fr, fi[0])
			if err != nil {
				return err
			}
			idx = append(idx, leaves...)
		}
	}
	rr, err := fr.GetRecordReader(ctx, idx, nil)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	defer rr.Release()
	for rr.Next() {
		if err := fn(rr.RecordBatch()); err != nil {
			return err
		}
	}
	if err := rr.Err(); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read %s: %w", path, err)
	}
	return nil
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
