package compact

import (
	"bytes"
	"fmt"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Snapshot is what a reader of the data as a whole needs of the
// manifest's first Shards shard entries, so that it reads only the
// entries after them (store.Reader.EntriesFrom): the shards table of those
// shards in a Parquet file (SnapshotSchema), and the dead-letter marks of
// every entry up to the last of them.
type Snapshot struct {
	// File is the snapshot's name in Dir.
	File string `json:"file"`
	// Shards is how many shard entries it holds: Record.Upto.
	Shards int `json:"shards"`
	// LastSeq and LastPath are the manifest place and path of shard entry
	// Shards-1, which a reader checks against its manifest.
	LastSeq  int64  `json:"last_seq"`
	LastPath string `json:"last_path"`
	// Rows is the snapshot's row count: Shards, less the shards the
	// manifest lists twice (read once).
	Rows int64 `json:"rows"`
	// Loose counts the rows read from their own files (no merged file).
	Loose int   `json:"loose"`
	Bytes int64 `json:"bytes"`
	// DeadLetters lists each dead-letter file the entries name, in order
	// of first mention, with the length the last of them made durable
	// and the marks that matter for counting its lines by entry.
	DeadLetters []DeadLetterMarks `json:"dead_letters,omitempty"`
}

// DeadLetterMarks is one dead-letter file as the manifest's entries up
// to a snapshot mark it.
type DeadLetterMarks struct {
	File string `json:"file"`
	// Bytes is the durable length the latest entry naming File recorded.
	Bytes int64 `json:"bytes"`
	// Marks are the entries' marks on File in manifest order, only those
	// a line can belong to: a line belongs to the first mark at or past
	// its end, so a mark no longer than one before it never gets one
	// and is left out; the last mark is always kept (lines past every
	// mark belong to it).
	Marks []Mark `json:"marks"`
}

// Mark is an entry's durable length of a dead-letter file.
type Mark struct {
	Seq   int64     `json:"seq"`
	At    time.Time `json:"at"`
	Bytes int64     `json:"bytes"`
}

// Snapshot column names (SnapshotSchema).
const (
	SnapSeq    = "seq"   // the entry's place in the manifest
	SnapShard  = "shard" // the entry's place among the shard entries
	SnapMerged = "merged"
)

// SnapshotSchema is the schema of a snapshot file: one row per shard in
// manifest order, the shards table's columns (less file) and merged, the
// merged file in Dir holding the shard's rows (null: read from its own).
var SnapshotSchema = arrow.NewSchema([]arrow.Field{
	{Name: SnapSeq, Type: arrow.PrimitiveTypes.Int64},
	{Name: SnapShard, Type: arrow.PrimitiveTypes.Int64},
	{Name: "path", Type: arrow.BinaryTypes.String},
	{Name: "rows", Type: arrow.PrimitiveTypes.Int64},
	{Name: "bytes", Type: arrow.PrimitiveTypes.Int64},
	{Name: "groups", Type: arrow.PrimitiveTypes.Int64},
	{Name: "policy_version", Type: arrow.PrimitiveTypes.Int64},
	{Name: "committed_at", Type: &arrow.TimestampType{Unit: arrow.Microsecond, TimeZone: "UTC"}, Nullable: true},
	{Name: "run_id", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: "writer", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: "recovered", Type: arrow.FixedWidthTypes.Boolean},
	{Name: "schema_version", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: SnapMerged, Type: arrow.BinaryTypes.String, Nullable: true},
}, nil)

// markState is what reducing one file's marks needs: the longest mark
// so far, and whether the last mark kept is kept only for being last.
type markState struct {
	most     int64
	lastOnly bool
}

func snapshotName(seq int64, writer string) string {
	return fmt.Sprintf("snapshot-%012d-%s.parquet", seq, writer)
}

// buildSnapshot returns the snapshot of entries (every manifest entry,
// each with its Seq) up to and including the upto-th shard entry's
// (upto > 0), with the shards of ranges marked merged, and its Parquet
// file.
func buildSnapshot(entries []schemas.ShardEntry, upto int, ranges []Range, mem memory.Allocator) (*Snapshot, []byte, error) {
	b := array.NewRecordBuilder(mem, SnapshotSchema)
	defer b.Release()
	var (
		snap  = &Snapshot{Shards: upto}
		seen  = map[string]bool{}
		dl    = map[string]int{} // file → its place in snap.DeadLetters
		marks []markState        // by that place
		shard = 0
		k     = 0 // the range shard may be in
	)
	str := func(i int, s string) {
		sb := b.Field(i).(*array.StringBuilder)
		if s == "" {
			sb.AppendNull()
			return
		}
		sb.Append(s)
	}
	for _, e := range entries {
		if shard == upto {
			break // the entries after are the readers' to read
		}
		if d := e.DeadLetters; d != nil && d.File != "" {
			m := Mark{Seq: e.Seq, At: e.CommittedAt, Bytes: d.Bytes}
			i, ok := dl[d.File]
			if !ok {
				i = len(snap.DeadLetters)
				dl[d.File] = i
				snap.DeadLetters = append(snap.DeadLetters, DeadLetterMarks{File: d.File})
				marks = append(marks, markState{most: -1})
			}
			f, st := &snap.DeadLetters[i], &marks[i]
			f.Bytes = d.Bytes
			if st.lastOnly { // kept only as the last: no longer
				f.Marks = f.Marks[:len(f.Marks)-1]
			}
			f.Marks = append(f.Marks, m)
			st.lastOnly = m.Bytes <= st.most
			st.most = max(st.most, m.Bytes)
		}
		if e.Path == "" {
			continue
		}
		at := shard
		shard++
		if shard == upto {
			snap.LastSeq, snap.LastPath = e.Seq, e.Path
		}
		if seen[e.Path] {
			continue // listed twice: read once, as the views do
		}
		seen[e.Path] = true
		for k < len(ranges) && ranges[k].End <= at {
			k++
		}
		merged := ""
		if k < len(ranges) && ranges[k].First <= at {
			merged = ranges[k].File
		} else {
			snap.Loose++
		}
		b.Field(0).(*array.Int64Builder).Append(e.Seq)
		b.Field(1).(*array.Int64Builder).Append(int64(at))
		b.Field(2).(*array.StringBuilder).Append(e.Path)
		b.Field(3).(*array.Int64Builder).Append(e.Rows)
		b.Field(4).(*array.Int64Builder).Append(e.Bytes)
		b.Field(5).(*array.Int64Builder).Append(int64(e.Groups))
		b.Field(6).(*array.Int64Builder).Append(e.PolicyVersion)
		if tb := b.Field(7).(*array.TimestampBuilder); e.CommittedAt.IsZero() {
			tb.AppendNull()
		} else {
			tb.Append(arrow.Timestamp(e.CommittedAt.UnixMicro()))
		}
		str(8, e.RunID)
		str(9, e.Writer)
		b.Field(10).(*array.BooleanBuilder).Append(e.Recovered)
		str(11, e.SchemaVersion)
		str(12, merged)
		snap.Rows++
	}
	if shard < upto {
		return nil, nil, fmt.Errorf("compact: snapshot: the manifest lists %d shards, not %d", shard, upto)
	}
	rec := b.NewRecordBatch()
	defer rec.Release()
	var buf bytes.Buffer
	w, err := parquet.NewWriter(&buf, SnapshotSchema, parquet.Options{Allocator: mem}, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("compact: snapshot: %w", err)
	}
	if err := w.Write(rec); err != nil {
		return nil, nil, fmt.Errorf("compact: snapshot: %w", err)
	}
	if err := w.Close(); err != nil {
		return nil, nil, fmt.Errorf("compact: snapshot: %w", err)
	}
	snap.Bytes = int64(buf.Len())
	return snap, buf.Bytes(), nil
}
