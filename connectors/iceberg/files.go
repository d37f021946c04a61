package iceberg

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/iceberg-go"
	icebergio "github.com/apache/iceberg-go/io"
	"github.com/apache/iceberg-go/table"

	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
)

// tableFile is a Parquet file the syncer writes under a table's data
// folder (a split shard's version, a merged file, dead letters,
// trajectories). Each is named anew by its writer, so that a writer that
// lost a race never rewrites a file a committed snapshot lists: a
// loser's files are orphans, as Iceberg's orphan-file removal knows them.
type tableFile struct {
	tbl  *table.Table
	fsys icebergio.IO
	path string
	sc   *arrow.Schema
	f    icebergio.FileWriter
	w    *parquet.Writer
}

// createFile starts the file name (under tbl's data folder) of schema
// sc, with meta in its footer.
func createFile(ctx context.Context, tbl *table.Table, name string, sc *arrow.Schema, meta map[string]string, mem memory.Allocator) (*tableFile, error) {
	fsys, err := tbl.FS(ctx)
	if err != nil {
		return nil, err
	}
	wfs, ok := fsys.(icebergio.WriteFileIO)
	if !ok {
		return nil, errors.New("iceberg: the table's file IO cannot write")
	}
	path := strings.TrimSuffix(tbl.Location(), "/") + "/data/" + name
	f, err := wfs.Create(path)
	if err != nil {
		return nil, fmt.Errorf("iceberg: create %s: %w", path, err)
	}
	sc = plainSchema(sc)
	w, err := parquet.NewWriter(f, sc, parquet.Options{Allocator: mem}, meta)
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("iceberg: write %s: %w", path, err)
	}
	return &tableFile{tbl: tbl, fsys: fsys, path: path, sc: sc, f: f, w: w}, nil
}

// write appends rec's rows.
func (t *tableFile) write(rec arrow.RecordBatch) error {
	if !rec.Schema().Equal(t.sc) || rec.Schema().HasMetadata() {
		rec = array.NewRecordBatch(t.sc, rec.Columns(), rec.NumRows())
		defer rec.Release()
	}
	if err := t.w.Write(rec); err != nil {
		return fmt.Errorf("iceberg: write %s: %w", t.path, err)
	}
	return nil
}

// finish closes the file and returns its entry for the table (its
// statistics read back from its footer).
func (t *tableFile) finish(ctx context.Context) (iceberg.DataFile, error) {
	err := t.w.Close()
	t.w = nil
	if cerr := t.f.Close(); err == nil {
		err = cerr
	}
	t.f = nil
	if err != nil {
		return nil, fmt.Errorf("iceberg: close %s: %w", t.path, err)
	}
	df, err := table.FileToDataFile(ctx, t.fsys, t.path, t.tbl.Schema(), t.tbl.Spec(), 0, t.tbl.Properties())
	if err != nil {
		return nil, fmt.Errorf("iceberg: %s: %w", t.path, err)
	}
	return df, nil
}

// abort closes the file after a failure, if not closed yet (it stays an
// orphan).
func (t *tableFile) abort() {
	if t.w != nil {
		_ = t.w.Close()
		t.w = nil
	}
	if t.f != nil {
		_ = t.f.Close()
		t.f = nil
	}
}

// writeRecord writes rec as the file name under tbl's data folder, with
// meta in its footer, and returns its entry.
func writeRecord(ctx context.Context, tbl *table.Table, rec arrow.RecordBatch, name string, meta map[string]string) (iceberg.DataFile, error) {
	t, err := createFile(ctx, tbl, name, rec.Schema(), meta, memory.DefaultAllocator)
	if err != nil {
		return nil, err
	}
	if err := t.write(rec); err != nil {
		t.abort()
		return nil, err
	}
	return t.finish(ctx)
}

// plainSchema is sc without its fields' metadata. A schema read from a
// Parquet file carries each field's Parquet field id (PARQUET:field_id,
// -1 in files written without ids); written back, readers such as
// pyiceberg would take those ids for Iceberg's and find no column where
// the table's name mapping would have found them all.
func plainSchema(sc *arrow.Schema) *arrow.Schema {
	fields := make([]arrow.Field, sc.NumFields())
	for i, f := range sc.Fields() {
		fields[i] = plainField(f)
	}
	return arrow.NewSchema(fields, nil)
}

func plainField(f arrow.Field) arrow.Field {
	out := arrow.Field{Name: f.Name, Type: f.Type, Nullable: f.Nullable}
	switch t := f.Type.(type) {
	case *arrow.ListType:
		out.Type = arrow.ListOfField(plainField(t.ElemField()))
	case *arrow.LargeListType:
		out.Type = arrow.LargeListOfField(plainField(t.ElemField()))
	case *arrow.StructType:
		fs := make([]arrow.Field, t.NumFields())
		for i, sf := range t.Fields() {
			fs[i] = plainField(sf)
		}
		out.Type = arrow.StructOf(fs...)
	case *arrow.MapType:
		m := arrow.MapOfFields(plainField(t.KeyField()), plainField(t.ItemField()))
		m.KeysSorted = t.KeysSorted
		out.Type = m
	}
	return out
}
