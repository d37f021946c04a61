package train

import (
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"

	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/train/merge"
)

// group is the rows of one group in one shard: slices of reader batches.
type group struct {
	shard   string // the shard's path
	ordinal int32  // the group's place in its shard (rows of a group are contiguous)
	key     string
	version int64
	parts   []arrow.RecordBatch // retained slices
	// srcs says where each part was sliced from (its reader batch,
	// retained, and the rows), so that a batch of parts that follow each
	// other in one reader batch is one slice of it, not a copy.
	srcs   []partSrc
	tokens int64
	rows   int64
	// filtered counts rows dropped because a filter marked them.
	filtered int64
	// marked: parts still hold the rows a filter marked (stored prefix
	// deltas may extend them); merging skips them.
	marked bool
	// finished is when the group's last trajectory finished at the
	// capture gateway (trajectory metadata finished_at; zero: unknown).
	finished time.Time
}

// partSrc is rows [lo, hi) of a reader batch.
type partSrc struct {
	rec    arrow.RecordBatch
	lo, hi int64
}

func (g *group) release() {
	for _, p := range g.parts {
		p.Release()
	}
	for _, s := range g.srcs {
		s.rec.Release()
	}
	g.parts, g.srcs = nil, nil
}

// addPart adds rows [lo, hi) of rec to g.
func (g *group) addPart(rec arrow.RecordBatch, lo, hi int64) {
	rec.Retain()
	g.parts = append(g.parts, rec.NewSlice(lo, hi))
	g.srcs = append(g.srcs, partSrc{rec, lo, hi})
}

// joinedParts returns the parts of groups, in order, with the parts that
// follow each other in one reader batch made one slice of it; the caller
// releases them.
func joinedParts(groups []*group) []arrow.RecordBatch {
	var runs []partSrc
	for _, g := range groups {
		for _, s := range g.srcs {
			if n := len(runs); n > 0 && runs[n-1].rec == s.rec && runs[n-1].hi == s.lo {
				runs[n-1].hi = s.hi
				continue
			}
			runs = append(runs, s)
		}
	}
	out := make([]arrow.RecordBatch, len(runs))
	for i, r := range runs {
		out[i] = r.rec.NewSlice(r.lo, r.hi)
	}
	return out
}

// shardReader splits a shard's record batches into groups, in order,
// numbering them from 0.
type shardReader struct {
	path            string
	rd              *parquet.Reader
	includeFiltered bool
	layout          Layout
	// deltas: rows come as stored (prompts as prefix deltas) and groups
	// keep their marked rows (see group.marked).
	deltas bool

	rec     arrow.RecordBatch // retained; nil before the first or after the last
	row     int
	ordinal int32
	eof     bool
	// cols of rec
	gid          *array.String
	ver          *array.Int64
	prompt, resp *array.List
	filterReason *array.String
	tmeta        *array.String // trajectory_metadata, when read
	// lastMeta is the last trajectory metadata parsed and its time: a
	// trajectory's rows repeat it.
	lastMeta string
	lastAt   time.Time
}

// newShardReader reads the groups of rd, opened with cfg.shardColumns().
func newShardReader(path string, rd *parquet.Reader, cfg *Config) *shardReader {
	s := &shardReader{path: path, rd: rd, includeFiltered: cfg.IncludeFiltered, layout: cfg.Layout, deltas: cfg.mergesDeltas()}
	if s.deltas {
		rd.KeepDeltas()
	}
	return s
}

// mergesDeltas reports whether batches are merged trajectory rows built
// from the rows as stored: prompts stay prefix deltas (train/merge works
// on them) and a batch's groups are merged without joining them first. A
// batch estimator needs the step rows joined, and rebuilt prompts.
func (c *Config) mergesDeltas() bool {
	return c.Layout == LayoutTrajectories && c.Batch == nil && !c.expand
}

// mergeColumns are the shard columns that merged trajectory rows are built
// from (shardReader's and merge.RowsOf's), prefix deltas included.
var mergeColumns = []string{
	"group_id", "group_version", "prompt_ids", "response_ids", "filter_reason",
	"task_id", "role", "trajectory_id", "step_id", "step_index", "num_steps", "group_size",
	"policy_version", "token_versions", "response_logprobs", "token_advantages", "reward", "advantage",
	"partial", "is_correct", "termination_reason", "estimator",
	"prompt_prefix_len", "prompt_delta_ids", "trajectory_metadata",
}

// shardColumns are the columns to read of a shard: all (nil) but when
// merging deltas.
func (c *Config) shardColumns() []string {
	if c.mergesDeltas() {
		if len(c.RequireSampling) > 0 {
			return append(slices.Clip(mergeColumns), "metadata")
		}
		return mergeColumns
	}
	return nil
}

// load makes s.rec the next non-empty record batch; false at the end.
func (s *shardReader) load() (bool, error) {
	for s.rec == nil || s.row >= int(s.rec.NumRows()) {
		if s.rec != nil {
			s.rec.Release()
			s.rec = nil
		}
		if s.eof {
			return false, nil
		}
		rec, err := s.rd.Next()
		if err == io.EOF {
			s.eof = true
			return false, nil
		}
		if err != nil {
			return false, err
		}
		sc := rec.Schema()
		for _, name := range []string{"group_id", "group_version", "prompt_ids", "response_ids", "filter_reason"} {
			if !sc.HasField(name) {
				return false, fmt.Errorf("train: shard %s has no column %s", s.path, name)
			}
		}
		col := func(name string) arrow.Array { return rec.Column(sc.FieldIndices(name)[0]) }
		var ok bool
		if s.gid, ok = col("group_id").(*array.String); !ok {
			return false, fmt.Errorf("train: shard %s: group_id is %s", s.path, col("group_id").DataType())
		}
		s.ver, _ = col("group_version").(*array.Int64)
		s.prompt, _ = col("prompt_ids").(*array.List)
		s.resp, _ = col("response_ids").(*array.List)
		s.filterReason, _ = col("filter_reason").(*array.String)
		s.tmeta = nil
		if sc.HasField("trajectory_metadata") {
			s.tmeta, _ = col("trajectory_metadata").(*array.String)
		}
		if s.ver == nil || s.prompt == nil || s.resp == nil || s.filterReason == nil {
			return false, fmt.Errorf("train: shard %s: unexpected column types (schema %s)", s.path, sc)
		}
		rec.Retain()
		s.rec, s.row = rec, 0
	}
	return true, nil
}

// next returns the shard's next group, or nil after the last. Rows a
// filter marked are dropped (and counted) unless includeFiltered. With
// LayoutTrajectories the group's tokens are those of its merged rows.
func (s *shardReader) next() (*group, error) {
	g, err := s.read()
	if err != nil || g == nil || s.layout != LayoutTrajectories {
		return g, err
	}
	if g.tokens, err = merge.TokensOf(g.parts, g.marked); err != nil {
		g.release()
		return nil, fmt.Errorf("train: shard %s: %w", s.path, err)
	}
	return g, nil
}

// read returns the shard's next group of step rows, or nil after the last.
func (s *shardReader) read() (*group, error) {
	var g *group
	for {
		ok, err := s.load()
		if err != nil {
			if g != nil {
				g.release()
			}
			return nil, err
		}
		if !ok {
			return g, nil
		}
		key := s.gid.Value(s.row)
		if g != nil && g.key != key {
			return g, nil
		}
		if g == nil {
			g = &group{shard: s.path, ordinal: s.ordinal, key: key, version: s.ver.Value(s.row), marked: s.deltas && !s.includeFiltered}
			s.ordinal++
		}
		n := int(s.rec.NumRows())
		end := s.row + 1
		for end < n && s.gid.Value(end) == key {
			end++
		}
		s.noteFinished(g, s.row, end)
		if s.deltas {
			// The whole run; merging skips the marked rows.
			var marked int64
			for j := s.row; j < end; j++ {
				if !s.includeFiltered && s.filterReason.IsValid(j) {
					marked++
				}
			}
			g.addPart(s.rec, int64(s.row), int64(end))
			g.filtered += marked
			g.rows += int64(end-s.row) - marked
			s.row = end
			continue
		}
		// Keep the runs of rows in [row, end) that pass the filter.
		for j := s.row; j < end; {
			if !s.includeFiltered && s.filterReason.IsValid(j) {
				g.filtered++
				j++
				continue
			}
			k := j
			for k < end && (s.includeFiltered || s.filterReason.IsNull(k)) {
				ps, pe := s.prompt.ValueOffsets(k)
				rs, re := s.resp.ValueOffsets(k)
				g.tokens += (pe - ps) + (re - rs)
				k++
			}
			g.addPart(s.rec, int64(j), int64(k))
			g.rows += int64(k - j)
			j = k
		}
		s.row = end
	}
}

// noteFinished advances g.finished to the latest finished_at of rows
// [lo, hi) of the current record.
func (s *shardReader) noteFinished(g *group, lo, hi int) {
	if s.tmeta == nil {
		return
	}
	for j := lo; j < hi; j++ {
		if s.tmeta.IsNull(j) {
			continue
		}
		if m := s.tmeta.Value(j); m != s.lastMeta {
			s.lastMeta = m
			s.lastAt, _ = schemas.FinishedAt([]byte(m))
		}
		if s.lastAt.After(g.finished) {
			g.finished = s.lastAt
		}
	}
}

// groups is the number of groups read so far (all of them after next
// returned nil).
func (s *shardReader) groups() int32 { return s.ordinal }

func (s *shardReader) close() error {
	if s.rec != nil {
		s.rec.Release()
		s.rec = nil
	}
	return s.rd.Close()
}
