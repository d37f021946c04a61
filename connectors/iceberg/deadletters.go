package iceberg

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/iceberg-go"
	"github.com/apache/iceberg-go/table"

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
// lines added, and the committed bytes of dead-letter files that are
// gone or shorter than their marks (left out, as sql leaves them).
func (s *Syncer) SyncDeadLetters(ctx context.Context) (added, missing int64, err error) {
	id := append(append(table.Identifier{}, s.cfg.Namespace...), DeadLettersTable)
	for conflicts := 0; ; conflicts++ {
		if conflicts > maxConflicts {
			return 0, missing, fmt.Errorf("iceberg: %d commits to %s lost a race in a row", conflicts, id)
		}
		tbl, err := s.openTable(ctx, id, deadLetterSchema, nil)
		if err != nil {
			return 0, 0, err
		}
		pos, err := positionOf(tbl, PropEntries)
		if err != nil {
			return 0, 0, err
		}
		entries, err := s.r.Entries(ctx)
		if err != nil {
			return 0, 0, fmt.Errorf("iceberg: read the manifest: %w", err)
		}
		if pos > len(entries) {
			return 0, 0, fmt.Errorf("iceberg: table %s holds the dead letters of %d manifest entries; the manifest of %s has %d", id, pos, s.r.Name(), len(entries))
		}
		rec, gone, err := s.deadLetterRows(ctx, entries, pos)
		if err != nil {
			return 0, 0, err
		}
		missing = gone
		if rec == nil {
			return 0, missing, nil
		}
		n := rec.NumRows()
		step("dead letters")
		file, err := writeRecord(ctx, tbl, rec, fmt.Sprintf("dead-letters-%d-%d-%s.parquet", pos, len(entries), newNonce()), nil)
		rec.Release()
		if err != nil {
			return 0, missing, err
		}
		ok, err := s.commitFiles(ctx, id, tbl, []iceberg.DataFile{file}, iceberg.Properties{PropEntries: strconv.Itoa(len(entries))})
		if err != nil {
			return 0, missing, err
		}
		if ok {
			return n, missing, nil
		}
	}
}

// deadLetterRows reads the lines entries[from:] committed: for each
// entry naming a dead-letter file, the lines between the file's previous
// mark and its own. nil when there are none.
func (s *Syncer) deadLetterRows(ctx context.Context, entries []schemas.ShardEntry, from int) (rec arrow.RecordBatch, missing int64, err error) {
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
		data, gone, err := s.readDeadLetters(ctx, dl.File, prev[dl.File], dl.Bytes)
		if err != nil {
			return nil, 0, err
		}
		missing += gone
		if gone > 0 {
			// A line cut short at the file's end is not whole: left out.
			if i := bytes.LastIndexByte(data, '\n'); i >= 0 {
				data = data[:i+1]
			} else {
				data = nil
			}
		}
		for _, line := range bytes.Split(data, []byte("\n")) {
			if len(bytes.TrimSpace(line)) == 0 {
				continue
			}
			var l schemas.DeadLetterLine
			if err := json.Unmarshal(line, &l); err != nil {
				return nil, 0, fmt.Errorf("iceberg: dead-letter file %s: %w", dl.File, err)
			}
			appendDeadLetter(b, l, dl.File, int64(i))
		}
		prev[dl.File] = dl.Bytes
	}
	if b.Field(0).Len() == 0 {
		return nil, missing, nil
	}
	return b.NewRecordBatch(), missing, nil
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
// file only that range is read. As sql's view, it reads what is there: a
// missing file (an outside --dlq file removed) gives nothing, a shorter
// one its bytes up to its end; missing counts the bytes not read.
func (s *Syncer) readDeadLetters(ctx context.Context, rel string, from, to int64) (data []byte, missing int64, err error) {
	var path string
	local := strings.HasPrefix(s.cfg.Base, "file://")
	switch {
	case filepath.IsAbs(rel) && local:
		path = rel
	case !store.CheckPath(rel):
		return nil, 0, fmt.Errorf("iceberg: dead-letter file %q is not a clean relative path", rel)
	case local:
		path = filepath.Join(strings.TrimPrefix(s.cfg.Base, "file://"), filepath.FromSlash(rel))
	default:
		data, err := s.r.Get(ctx, rel)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, to - from, nil
		}
		if err != nil {
			return nil, 0, fmt.Errorf("iceberg: dead-letter file %s: %w", rel, err)
		}
		end := min(to, int64(len(data)))
		if from >= end {
			return nil, to - from, nil
		}
		return data[from:end], to - end, nil
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, to - from, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("iceberg: dead-letter file: %w", err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil || !info.Mode().IsRegular() {
		return nil, 0, fmt.Errorf("iceberg: dead-letter file %s: not a regular file (%v)", path, err)
	}
	end := min(to, info.Size())
	if from >= end {
		return nil, to - from, nil
	}
	data = make([]byte, end-from)
	if _, err := f.ReadAt(data, from); err != nil {
		return nil, 0, fmt.Errorf("iceberg: dead-letter file %s: %w", path, err)
	}
	return data, to - end, nil
}
