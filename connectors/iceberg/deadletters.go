package iceberg

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/iceberg-go"
	icebergio "github.com/apache/iceberg-go/io"
	"github.com/apache/iceberg-go/table"

	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// DeadLettersTable is the name of the dead letters' table.
const DeadLettersTable = "dead_letters"

// PropEntries is, in a dead_letters snapshot's summary, how many manifest
// entries (of every kind) the table holds the dead letters of.
const PropEntries = "rllm-pipe.entries"

// deadLetterSchema is the dead letters' table: schemas.DeadLetterLine's
// fields, the file that held the line, and the manifest entry (its place
// in the manifest, from 0) that committed it.
var deadLetterSchema = arrow.NewSchema([]arrow.Field{
	{Name: "reason", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: "error", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: "source_file", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: "source_line", Type: arrow.PrimitiveTypes.Int64, Nullable: true},
	{Name: "source_topic", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: "source_partition", Type: arrow.PrimitiveTypes.Int32, Nullable: true},
	{Name: "source_offset", Type: arrow.PrimitiveTypes.Int64, Nullable: true},
	{Name: "record", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: "record_encoding", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: "truncated", Type: arrow.FixedWidthTypes.Boolean, Nullable: true},
	{Name: "size", Type: arrow.PrimitiveTypes.Int64, Nullable: true},
	{Name: "dlq_file", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: "manifest_entry", Type: arrow.PrimitiveTypes.Int64, Nullable: true},
}, nil)

// SyncDeadLetters adds the dead letters the manifest committed since the
// table's position (PropEntries) to NAMESPACE.dead_letters, in one file
// and one snapshot, by the protocol of the steps table. It returns the
// lines added.
func (s *Syncer) SyncDeadLetters(ctx context.Context) (int64, error) {
	id := append(append(table.Identifier{}, s.cfg.Namespace...), DeadLettersTable)
	var added int64
	for conflicts := 0; ; conflicts++ {
		if conflicts > maxConflicts {
			return added, fmt.Errorf("iceberg: %d commits to %s lost a race in a row", conflicts, id)
		}
		tbl, err := s.openTable(ctx, id, deadLetterSchema, nil)
		if err != nil {
			return added, err
		}
		pos, err := positionOf(tbl, PropEntries)
		if err != nil {
			return added, err
		}
		entries, err := s.r.Entries(ctx)
		if err != nil {
			return added, fmt.Errorf("iceberg: read the manifest: %w", err)
		}
		if pos > len(entries) {
			return added, fmt.Errorf("iceberg: table %s holds the dead letters of %d manifest entries; the manifest of %s has %d", id, pos, s.r.Name(), len(entries))
		}
		rec, err := s.deadLetterRows(ctx, entries, pos)
		if err != nil {
			return added, err
		}
		if rec == nil {
			return added, nil
		}
		n := rec.NumRows()
		step("dead letters")
		file, err := writeRecord(ctx, tbl, rec, fmt.Sprintf("dead-letters-%d-%d-%s.parquet", pos, len(entries), newNonce()))
		rec.Release()
		if err != nil {
			return added, err
		}
		ok, err := s.commitFiles(ctx, id, tbl, []iceberg.DataFile{file}, iceberg.Properties{PropEntries: strconv.Itoa(len(entries))})
		if err != nil {
			return added, err
		}
		if ok {
			return added + n, nil
		}
	}
}

// deadLetterRows reads the lines entries[from:] committed: for each
// entry naming a dead-letter file, the lines between the file's previous
// mark and its own. nil when there are none.
func (s *Syncer) deadLetterRows(ctx context.Context, entries []schemas.ShardEntry, from int) (arrow.RecordBatch, error) {
	prev := map[string]int64{} // per file, the largest mark read so far
	for _, e := range entries[:from] {
		if dl := e.DeadLetters; dl != nil && dl.File != "" {
			prev[dl.File] = max(prev[dl.File], dl.Bytes)
		}
	}
	b := array.NewRecordBuilder(memory.NewGoAllocator(), deadLetterSchema)
	defer b.Release()
	for i := from; i < len(entries); i++ {
		dl := entries[i].DeadLetters
		if dl == nil || dl.File == "" || dl.Bytes <= prev[dl.File] {
			continue
		}
		data, err := s.readDeadLetters(ctx, dl.File, prev[dl.File], dl.Bytes)
		if err != nil {
			return nil, err
		}
		for _, line := range bytes.Split(data, []byte("\n")) {
			if len(bytes.TrimSpace(line)) == 0 {
				continue
			}
			var l schemas.DeadLetterLine
			if err := json.Unmarshal(line, &l); err != nil {
				return nil, fmt.Errorf("iceberg: dead-letter file %s: %w", dl.File, err)
			}
			appendDeadLetter(b, l, dl.File, int64(i))
		}
		prev[dl.File] = dl.Bytes
	}
	if b.Field(0).Len() == 0 {
		return nil, nil
	}
	return b.NewRecordBatch(), nil
}

func appendDeadLetter(b *array.RecordBuilder, l schemas.DeadLetterLine, file string, entry int64) {
	str := func(i int, v string) {
		if v == "" {
			b.Field(i).AppendNull()
			return
		}
		b.Field(i).(*array.StringBuilder).Append(v)
	}
	i64 := func(i int, v int64, set bool) {
		if !set {
			b.Field(i).AppendNull()
			return
		}
		b.Field(i).(*array.Int64Builder).Append(v)
	}
	str(0, string(l.Reason))
	str(1, l.Error)
	str(2, l.Source.File)
	i64(3, l.Source.Line, l.Source.File != "")
	str(4, l.Source.Topic)
	if l.Source.Topic != "" {
		b.Field(5).(*array.Int32Builder).Append(l.Source.Partition)
	} else {
		b.Field(5).AppendNull()
	}
	i64(6, l.Source.Offset, l.Source.Topic != "")
	b.Field(7).(*array.StringBuilder).Append(l.Record)
	str(8, l.RecordEncoding)
	b.Field(9).(*array.BooleanBuilder).Append(l.Truncated)
	i64(10, l.Size, l.Truncated)
	str(11, file)
	i64(12, entry, true)
}

// readDeadLetters reads bytes [from, to) of a dead-letter file a
// manifest entry names: a path under the root, or (a local root's --dlq
// elsewhere) an absolute path, which must be a regular file. Of a local
// file only that range is read.
func (s *Syncer) readDeadLetters(ctx context.Context, rel string, from, to int64) ([]byte, error) {
	var path string
	local := strings.HasPrefix(s.cfg.Base, "file://")
	switch {
	case filepath.IsAbs(rel) && local:
		path = rel
	case !store.CheckPath(rel):
		return nil, fmt.Errorf("iceberg: dead-letter file %q is not a clean relative path", rel)
	case local:
		path = filepath.Join(strings.TrimPrefix(s.cfg.Base, "file://"), filepath.FromSlash(rel))
	default:
		data, err := s.r.Get(ctx, rel)
		if err != nil {
			return nil, fmt.Errorf("iceberg: dead-letter file %s: %w", rel, err)
		}
		if to > int64(len(data)) {
			return nil, fmt.Errorf("iceberg: dead-letter file %s: marked at %d bytes, it has %d", rel, to, len(data))
		}
		return data[from:to], nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("iceberg: dead-letter file: %w", err)
	}
	defer f.Close()
	if info, err := f.Stat(); err != nil || !info.Mode().IsRegular() || info.Size() < to {
		return nil, fmt.Errorf("iceberg: dead-letter file %s: not a regular file of at least %d bytes (%v)", path, to, err)
	}
	data := make([]byte, to-from)
	if _, err := f.ReadAt(data, from); err != nil {
		return nil, fmt.Errorf("iceberg: dead-letter file %s: %w", path, err)
	}
	return data, nil
}

// writeRecord writes rec as a Parquet file named name under tbl's data
// folder and returns its entry.
func writeRecord(ctx context.Context, tbl *table.Table, rec arrow.RecordBatch, name string) (iceberg.DataFile, error) {
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
	w, err := parquet.NewWriter(f, rec.Schema(), parquet.Options{}, nil)
	if err == nil {
		err = w.Write(rec)
		if cerr := w.Close(); err == nil {
			err = cerr
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("iceberg: write %s: %w", path, err)
	}
	return table.FileToDataFile(ctx, fsys, path, tbl.Schema(), tbl.Spec(), 0, tbl.Properties())
}
