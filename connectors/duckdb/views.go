package duckdb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/apache/arrow-go/v18/arrow"
	duckdbdrv "github.com/duckdb/duckdb-go/v2"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// View is one view over the committed data.
type View struct {
	Name string
	// Doc says in a line what a row is.
	Doc string
	// SQL is the CREATE OR REPLACE VIEW statement (over absolute local
	// paths), ready to paste into the DuckDB CLI.
	SQL string
}

// shardFile is a committed shard and the local file holding it.
type shardFile struct {
	entry schemas.ShardEntry
	seq   int64  // place in the manifest
	at    int    // place among the manifest's shard entries (store.Reader.Committed)
	file  string // absolute local path
	// merged: file is a compacted file (connectors/compact) holding this
	// shard's rows among others', each naming its shard in a column.
	merged bool
	// fromSnap: the shards table has this shard's row from the
	// compaction snapshot already (layout.snap).
	fromSnap bool
}

// dlqFile is the committed part of one dead-letter file.
type dlqFile struct {
	rel  string // as the manifest names it
	file string // absolute local path of a file holding exactly the committed lines
	// longest is the longest line, in bytes (DuckDB's JSON reader needs a
	// bound on object size).
	longest int
	// commits counts the lines by the manifest entry that committed them
	// and by reason.
	commits []dlCommit
}

// layout is what the views read.
type layout struct {
	// base is the folder the shard files lie under, as base + "/" + path.
	base   string
	shards []shardFile
	dlq    []dlqFile
	// mergedDir is the folder of the compacted files (ending in a
	// separator), "" when none is read.
	mergedDir string
	// consumed is the file of the consumed rows (JSON lines, written by
	// Go from the consumer groups' logs); "" when there are none.
	consumed string
	// staleSkips are the stale_skips rows, as SQL VALUES ("" when none).
	staleSkips string
	// snap, when set, is the compaction snapshot holding the shards
	// table's first rows: shards then lists only the snapshot's shards
	// read from their own files (fromSnap) and the shards after it, and
	// snapMerged the compacted files (one each, merged) the snapshot's
	// other shards are read from.
	snap       *snapRows
	snapMerged []shardFile
}

// count is the number of committed shards the views read.
func (l *layout) count() int {
	if l.snap == nil {
		return len(l.shards)
	}
	n := int(l.snap.rows)
	for _, s := range l.shards {
		if !s.fromSnap {
			n++
		}
	}
	return n
}

// empty reports whether the views read no file.
func (l *layout) empty() bool { return len(l.shards) == 0 && len(l.snapMerged) == 0 }

// View names, in the order they are created (each reads the ones before).
const (
	ViewShards       = "shards"
	ViewStoredSteps  = "stored_steps"
	ViewSteps        = "steps"
	ViewTrajectories = "trajectories"
	ViewGroups       = "groups"
	ViewDeadLetters  = "dead_letters"
	ViewDLCommits    = "dead_letter_commits"
	ViewConsumed     = "consumed"
	ViewStaleSkips   = "stale_skips"
	ViewPromptForks  = "prompt_forks"
	ViewStepVersions = "step_versions"
	ViewSampling     = "step_sampling"
)

func (l *layout) views() ([]View, error) {
	stored, err := l.storedStepsSQL(false)
	if err != nil {
		return nil, err
	}
	return []View{
		{ViewShards, "one row per committed shard (manifest entries, in manifest order)", l.shardsSQL()},
		{ViewStoredSteps, "one row per committed step as stored (a delta prompt's prompt_ids is null: see steps), plus shard, " +
			"prompt_tokens (the whole prompt's length, counted without rebuilding it) and response_tokens", stored},
		{ViewSteps, "one row per committed step: every row of the committed shards, whole prompts and messages, plus shard (its manifest path)", l.stepsSQL()},
		{ViewTrajectories, "one row per trajectory (group_id, group_version, trajectory_id); pass = coalesce(is_correct, reward > 0)", trajectoriesSQL},
		{ViewGroups, "one row per group (group_id, group_version); reward_std is the population std", groupsSQL},
		{ViewPromptForks, "one row per step whose prompt does not extend its trajectory's previous step's prompt + response " +
			"(a chat template re-rendered history, a context reset): fork_at is the first token where they differ (the common prefix's length), " +
			"prev_tokens the previous step's prompt + response length; such a step starts a new trainer row", promptForksSQL},
		{ViewStepVersions, "one row per committed step: the policy version of each response token (response_versions, aligned with response_ids: " +
			"token_versions where the step has them, else the step's version), its oldest (what staleness is judged by) and newest, and where a new version " +
			"begins (version_changes {at, version}: a generation interrupted by a weight update and continued)", stepVersionsSQL},
		{ViewSampling, "one row per committed step: the sampling parameters and logprobs mode it was generated with (metadata.sampling, " +
			"as the gateway records them or a producer writes them; NULL where not recorded), sampling the whole object", stepSamplingSQL},
		{ViewDeadLetters, "one row per committed dead letter", l.deadLettersSQL()},
		{ViewDLCommits, "per manifest entry (seq, committed_at), dead-letter file and reason: the dead letters that entry committed " +
			"(a line belongs to the first entry whose mark on its file covers it)", l.deadLetterCommitsSQL()},
		{ViewConsumed, "one row per group of each batch a consumer group acknowledged (train_step: the batch's place in the group's acknowledgements, from 0); staleness = policy_version - group_version, 0 when the group is newer (as the consumer counts it); a table read when opened", l.consumedSQL()},
		{ViewStaleSkips, "per consumer group and policy version, the groups it skipped as staler than its --max-staleness (rollouts thrown away), as its log counts them (the newest 256 versions); a table read when opened", l.staleSkipsSQL()},
	}, nil
}

// staleSkipsSQL makes the stale_skips table, its rows in the statement.
func (l *layout) staleSkipsSQL() string {
	if l.staleSkips == "" {
		return "CREATE OR REPLACE TABLE stale_skips AS\nSELECT NULL::VARCHAR AS consumer_group, NULL::BIGINT AS policy_version, NULL::BIGINT AS groups WHERE false;\n"
	}
	return "CREATE OR REPLACE TABLE stale_skips AS\nSELECT * FROM (VALUES\n  " + l.staleSkips + "\n) AS t(consumer_group, policy_version, groups)\nORDER BY consumer_group, policy_version;\n"
}

// sqlString quotes s as a SQL string literal.
func sqlString(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func sqlNullString(s string) string {
	if s == "" {
		return "NULL"
	}
	return sqlString(s)
}

func (l *layout) shardsSQL() string {
	if l.snap == nil {
		return "CREATE OR REPLACE TABLE shards (" + shardsColumns + ");\n"
	}
	// From a compaction snapshot: its rows are read from its file when a
	// query reads the shards (nothing is copied at start-up), the others'
	// from a table; the files the views read listed in a table of their
	// own (filesSQL, the sandbox), so that nothing at start-up reads a
	// row per merged shard.
	return "CREATE OR REPLACE TABLE " + shardsAfter + " (" + shardsColumns + ");\n" +
		"CREATE OR REPLACE TABLE " + viewFiles + " (grp INTEGER, ord INTEGER, file VARCHAR);\n" +
		"CREATE OR REPLACE VIEW shards AS\nSELECT * FROM ((" + l.snapSelect() + ")\nUNION ALL SELECT * FROM " + shardsAfter + ")\nORDER BY seq;\n"
}

// The tables behind the shards view of an opening from a compaction
// snapshot: the shards after it, and the files the views read (the
// group of bySchema each belongs to, its place in the group's list).
const (
	shardsAfter = "rllm_shards_after_snapshot"
	viewFiles   = "rllm_view_files"
)

// shardsValuesSQL is the shards table as a view over a VALUES list: the
// form --views-sql prints, which names no file of ours but, after a
// compaction, the copy of its snapshot that the rows before it are read
// from (in the download folder: kept after Close with
// Options.DownloadDir).
func (l *layout) shardsValuesSQL() string {
	var b strings.Builder
	b.WriteString("CREATE OR REPLACE VIEW shards AS\n")
	cols := "seq, path, \"rows\", bytes, \"groups\", policy_version, committed_at, run_id, writer, recovered, schema_version, file"
	var rest []shardFile // the rows after the snapshot's
	for _, s := range l.shards {
		if !s.fromSnap {
			rest = append(rest, s)
		}
	}
	if l.snap != nil {
		// The snapshot's rows, read from its file, then the others.
		b.WriteString("SELECT * FROM ((" + l.snapSelect() + ")\n")
		if len(rest) == 0 {
			b.WriteString(") ORDER BY seq;\n")
			return b.String()
		}
		b.WriteString("UNION ALL\n")
	}
	if len(rest) == 0 {
		b.WriteString("SELECT NULL::BIGINT AS seq, NULL::VARCHAR AS path, NULL::BIGINT AS \"rows\", NULL::BIGINT AS bytes, NULL::BIGINT AS \"groups\",\n")
		b.WriteString("  NULL::BIGINT AS policy_version, NULL::TIMESTAMPTZ AS committed_at, NULL::VARCHAR AS run_id, NULL::VARCHAR AS writer,\n")
		b.WriteString("  NULL::BOOLEAN AS recovered, NULL::VARCHAR AS schema_version, NULL::VARCHAR AS file\nWHERE false;\n")
		return b.String()
	}
	b.WriteString("SELECT seq::BIGINT AS seq, path::VARCHAR AS path, \"rows\"::BIGINT AS \"rows\", bytes::BIGINT AS bytes, \"groups\"::BIGINT AS \"groups\",\n")
	b.WriteString("  policy_version::BIGINT AS policy_version, committed_at::TIMESTAMPTZ AS committed_at, run_id::VARCHAR AS run_id,\n")
	b.WriteString("  writer::VARCHAR AS writer, recovered::BOOLEAN AS recovered, schema_version::VARCHAR AS schema_version, file::VARCHAR AS file\n")
	b.WriteString("FROM (VALUES\n")
	for i, s := range rest {
		e := s.entry
		committed := "NULL"
		if !e.CommittedAt.IsZero() {
			committed = sqlString(e.CommittedAt.UTC().Format(time.RFC3339Nano))
		}
		fmt.Fprintf(&b, "  (%d, %s, %d, %d, %d, %d, %s, %s, %s, %t, %s, %s)", s.seq, sqlString(e.Path), e.Rows, e.Bytes, e.Groups,
			e.PolicyVersion, committed, sqlNullString(e.RunID), sqlNullString(e.Writer), e.Recovered, sqlNullString(e.SchemaVersion), sqlString(s.file))
		if i < len(rest)-1 {
			b.WriteString(",")
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, ") AS t(%s)", cols)
	if l.snap != nil {
		b.WriteString(") ORDER BY seq")
	}
	b.WriteString(";\n")
	return b.String()
}

// shardsColumns are the columns of the shards table, in the order
// appendShards gives their values.
const shardsColumns = `seq BIGINT, path VARCHAR, "rows" BIGINT, bytes BIGINT, "groups" BIGINT, policy_version BIGINT,
  committed_at TIMESTAMPTZ, run_id VARCHAR, writer VARCHAR, recovered BOOLEAN, schema_version VARCHAR, file VARCHAR`

// appendShards fills the shards table (created by shardsSQL) through
// DuckDB's appender on conn: rows handed over in memory, where a file of
// the rows to read back, or a VALUES list to parse, cost several times
// more per shard (docs/performance.md#sql-start-up, "sql start-up").
func (l *layout) appendShards(ctx context.Context, conn *sql.Conn) error {
	if l.snap != nil {
		if err := l.appendFiles(ctx, conn); err != nil {
			return err
		}
	}
	if l.count() == 0 || l.snap != nil && int(l.snap.rows) == l.count() {
		return nil
	}
	null := func(s string) driver.Value {
		if s == "" {
			return nil
		}
		return s
	}
	return conn.Raw(func(dc any) error {
		c, ok := dc.(driver.Conn)
		if !ok {
			return fmt.Errorf("shards: unexpected driver connection %T", dc)
		}
		table := ViewShards
		if l.snap != nil {
			table = shardsAfter
		}
		a, err := duckdbdrv.NewAppenderFromConn(c, "", table)
		if err != nil {
			return fmt.Errorf("shards: %w", err)
		}
		for i, s := range l.shards {
			if i%4096 == 0 {
				if err := ctx.Err(); err != nil {
					return errors.Join(err, a.Close())
				}
			}
			if s.fromSnap {
				continue // inserted from the snapshot
			}
			e := s.entry
			var committed driver.Value
			if !e.CommittedAt.IsZero() {
				committed = e.CommittedAt.UTC()
			}
			if err := a.AppendRow(s.seq, e.Path, e.Rows, e.Bytes, int64(e.Groups), e.PolicyVersion, committed,
				null(e.RunID), null(e.Writer), e.Recovered, null(e.SchemaVersion), s.file); err != nil {
				return errors.Join(fmt.Errorf("shards: %w", err), a.Close())
			}
		}
		if err := a.Close(); err != nil {
			return fmt.Errorf("shards: %w", err)
		}
		return nil
	})
}

// deltas reports whether a shard may store prompts as deltas (schema 4
// or later): one is enough to need the delta columns, which
// union_by_name gives older shards as NULLs.
func (l *layout) deltas() bool {
	for _, s := range append(l.snapMerged[:len(l.snapMerged):len(l.snapMerged)], l.shards...) {
		if v, err := strconv.Atoi(s.entry.SchemaVersion); err == nil && v >= 4 {
			return true
		}
	}
	return false
}

// storedStepsSQL reads the listed files, never a glob: named by the
// variables filesSQL sets, or, literal, listed in the view's text (the
// form --views-sql prints, which a DuckDB database file can keep: a
// variable lasts a session). Hive partitioning
// is off (the policy=<N> folder is not a column); union_by_name lets
// shards of older schema versions, missing newer columns, be read with
// the others. prompt_tokens is the length of the whole prompt: a delta
// row's is its prefix length plus its delta's (schemas.ColPromptPrefixLen),
// so counting tokens needs no window over the steps, which rebuilding the
// prompts (steps) does.
func (l *layout) storedStepsSQL(literal bool) (string, error) {
	var b strings.Builder
	b.WriteString("CREATE OR REPLACE VIEW stored_steps AS\n")
	if l.empty() {
		b.WriteString("SELECT ")
		for _, f := range schemas.StepSchema.Fields() {
			t, err := duckType(f.Type)
			if err != nil {
				return "", fmt.Errorf("column %s: %w", f.Name, err)
			}
			fmt.Fprintf(&b, "NULL::%s AS %s, ", t, f.Name)
		}
		b.WriteString("NULL::VARCHAR AS shard, NULL::BIGINT AS prompt_tokens, NULL::BIGINT AS response_tokens\nWHERE false;\n")
		return b.String(), nil
	}
	prompt := "len(prompt_ids)"
	if l.deltas() {
		prompt = "CASE WHEN coalesce(prompt_prefix_len, 0) = 0 THEN len(prompt_ids) ELSE prompt_prefix_len + len(prompt_delta_ids) END"
	}
	fmt.Fprintf(&b, "SELECT *, %s::BIGINT AS prompt_tokens, len(response_ids)::BIGINT AS response_tokens\nFROM (\n", prompt)
	for i, v := range l.bySchema() {
		if i > 0 {
			b.WriteString("\nUNION ALL BY NAME\n")
		}
		// Shards of the current schema version share their columns: one
		// footer binds them all (union_by_name reads every footer at
		// each binding of the view, every query: most of the time to
		// define the views, measured in docs/performance.md#sql-start-up). Others are read
		// by name, a version at a time. Compacted files name each row's
		// shard in a column of their own.
		byName := v.version != schemas.SchemaVersion
		files := fmt.Sprintf("getvariable('%s')", filesVar(i))
		if literal {
			quoted := make([]string, len(v.files))
			for j, f := range v.files {
				quoted[j] = sqlString(f)
			}
			files = "[\n  " + strings.Join(quoted, ",\n  ") + "\n]"
		}
		if v.merged {
			fmt.Fprintf(&b, "SELECT * FROM read_parquet(%s, hive_partitioning = false, union_by_name = %t)", files, byName)
			continue
		}
		// DuckDB reports each row's file name as given: strip base + "/"
		// (substr counts code points).
		fmt.Fprintf(&b, "SELECT * EXCLUDE (filename), substr(filename, %d) AS shard\nFROM read_parquet(%s, hive_partitioning = false, union_by_name = %t, filename = true)",
			utf8.RuneCountInString(l.base)+2, files, byName)
	}
	b.WriteString(");\n")
	return b.String(), nil
}

// filesVar names the variable holding the files of the i-th schema
// version of bySchema.
func filesVar(i int) string { return fmt.Sprintf("rllm_shard_files_%d", i) }

// filesSQL sets the variables the stored_steps view reads its files
// from, one per schema version (bySchema), from the shards table, in
// manifest order. Variables belong to a connection: DB runs this on each
// one. The view names a variable rather than listing its files because
// DuckDB parses and binds a literal list at a cost that grows with the
// run (a run has millions of shards), where a list read from a table
// costs a small part of that.
func (l *layout) filesSQL() string {
	var b strings.Builder
	if l.snap != nil {
		for i := range l.bySchema() {
			fmt.Fprintf(&b, "SET VARIABLE %s = (SELECT list(file ORDER BY ord) FROM %s WHERE grp = %d);\n", filesVar(i), viewFiles, i)
		}
		return b.String()
	}
	for i, v := range l.bySchema() {
		if v.merged {
			fmt.Fprintf(&b, "SET VARIABLE %s = (SELECT list(file ORDER BY first) FROM (SELECT file, min(seq) AS first FROM shards WHERE starts_with(file, %s) AND coalesce(schema_version, '') = %s GROUP BY file));\n",
				filesVar(i), sqlString(l.mergedDir), sqlString(v.version))
			continue
		}
		fmt.Fprintf(&b, "SET VARIABLE %s = (SELECT list(file ORDER BY seq) FROM shards WHERE coalesce(schema_version, '') = %s", filesVar(i), sqlString(v.version))
		if l.mergedDir != "" {
			fmt.Fprintf(&b, " AND NOT starts_with(file, %s)", sqlString(l.mergedDir))
		}
		b.WriteString(");\n")
	}
	return b.String()
}

// schemaFiles is the files of the shards of one schema version: their
// own files, or (merged) the compacted files holding them.
type schemaFiles struct {
	version string
	merged  bool
	files   []string
}

// bySchema groups the shard files by schema version, the current version
// first, the others in the order they first appear; the compacted files
// of a version before its other shard files (compactions merge the
// earliest shards), each once.
func (l *layout) bySchema() []schemaFiles {
	var out []schemaFiles
	type key struct {
		version string
		merged  bool
	}
	at := map[key]int{}
	seen := map[string]bool{}
	add := func(s shardFile) {
		if s.merged {
			if seen[s.file] {
				return
			}
			seen[s.file] = true
		}
		k := key{s.entry.SchemaVersion, s.merged}
		i, ok := at[k]
		if !ok {
			i = len(out)
			at[k] = i
			out = append(out, schemaFiles{version: k.version, merged: k.merged})
		}
		out[i].files = append(out[i].files, s.file)
	}
	for _, s := range l.snapMerged { // before the others: the earliest shards
		if s.entry.SchemaVersion == schemas.SchemaVersion {
			add(s)
		}
	}
	for _, merged := range []bool{true, false} {
		for _, s := range l.shards {
			if s.entry.SchemaVersion == schemas.SchemaVersion && s.merged == merged {
				add(s)
			}
		}
	}
	for _, s := range append(l.snapMerged[:len(l.snapMerged):len(l.snapMerged)], l.shards...) {
		if s.entry.SchemaVersion != schemas.SchemaVersion {
			add(s)
		}
	}
	return out
}

// stepsSQL reads stored_steps and, when a shard may hold deltas, rebuilds
// the whole prompts and messages.
func (l *layout) stepsSQL() string {
	const stored = "SELECT * EXCLUDE (prompt_tokens, response_tokens) FROM stored_steps"
	if l.empty() || !l.deltas() {
		return "CREATE OR REPLACE VIEW steps AS\n" + stored + ";\n"
	}
	return "CREATE OR REPLACE VIEW steps AS\nWITH stored AS (" + stored + ")\n" + wholePromptsSQL + ";\n"
}

// wholePromptsSQL rebuilds the prompts and messages stored as prefix
// deltas (schemas.ColPromptPrefixLen): a chain starts at a row that
// stores its whole prompt, and a row's whole prompt is the chain's rows
// before it, each prompt (or delta) followed by its response, then its
// own delta. Messages likewise, each row before it without its closing
// bracket. Shards of schema 3 have neither column: every row starts a
// chain.
const wholePromptsSQL = `, chained AS (
SELECT *,
  sum(CASE WHEN coalesce(prompt_prefix_len, 0) = 0 THEN 1 ELSE 0 END) OVER (PARTITION BY shard, trajectory_id ORDER BY step_index ROWS UNBOUNDED PRECEDING) AS prompt_chain_,
  sum(CASE WHEN messages_delta IS NULL THEN 1 ELSE 0 END) OVER (PARTITION BY shard, trajectory_id ORDER BY step_index ROWS UNBOUNDED PRECEDING) AS messages_chain_
FROM stored)
SELECT * EXCLUDE (prompt_chain_, messages_chain_) REPLACE (
  CASE WHEN coalesce(prompt_prefix_len, 0) = 0 THEN prompt_ids ELSE list_concat(flatten(list(list_concat(coalesce(prompt_ids, prompt_delta_ids), response_ids)) OVER (
    PARTITION BY shard, trajectory_id, prompt_chain_ ORDER BY step_index ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)), prompt_delta_ids) END AS prompt_ids,
  CASE WHEN messages_delta IS NULL THEN messages ELSE string_agg(substr(coalesce(messages, messages_delta), 1, length(coalesce(messages, messages_delta)) - 1), '') OVER (
    PARTITION BY shard, trajectory_id, messages_chain_ ORDER BY step_index ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) || messages_delta END AS messages)
FROM chained`

// WholePrompts returns a query of the rows of stored (a query of shard
// rows of schema 4 with a shard column naming their file) with whole
// prompt_ids and messages: for reading shard files with DuckDB outside
// the views, as in `--views-sql`.
func WholePrompts(stored string) string {
	return "WITH stored AS (" + stored + ")\n" + wholePromptsSQL
}

// duckType is DuckDB's name of an Arrow type of StepSchema.
func duckType(t arrow.DataType) (string, error) {
	switch t := t.(type) {
	case *arrow.StringType:
		return "VARCHAR", nil
	case *arrow.BooleanType:
		return "BOOLEAN", nil
	case *arrow.Int32Type:
		return "INTEGER", nil
	case *arrow.Int64Type:
		return "BIGINT", nil
	case *arrow.Float32Type:
		return "FLOAT", nil
	case *arrow.Float64Type:
		return "DOUBLE", nil
	case *arrow.TimestampType:
		if t.TimeZone != "" {
			return "TIMESTAMPTZ", nil
		}
		return "TIMESTAMP", nil
	case *arrow.ListType:
		e, err := duckType(t.Elem())
		if err != nil {
			return "", err
		}
		return e + "[]", nil
	case *arrow.MapType:
		k, err := duckType(t.KeyType())
		if err != nil {
			return "", err
		}
		v, err := duckType(t.ItemType())
		if err != nil {
			return "", err
		}
		return "MAP(" + k + ", " + v + ")", nil
	}
	return "", fmt.Errorf("no DuckDB type for %s", t)
}

// trajectoriesSQL folds the steps of a trajectory (as stored: it needs
// their token counts, never the tokens), per shard holding its key first
// (two runs with overlapping ids ingested into one root), then keeps the
// first shard's fold, counts and sums included, so every query gives the
// same answer whatever order the rows are scanned in (a compacted file
// holds many shards' rows). Trajectory and group values are repeated on
// every step row, so arg_min(x, step_index) (which skips nulls) reads
// them: the first step's; groups likewise by {shard, trajectory_id};
// advantage is the first step's (ingest broadcasts one value per
// trajectory; token-level advantages stay in steps).
const trajectoriesSQL = `CREATE OR REPLACE VIEW trajectories AS
WITH per_shard AS (
  SELECT group_id, group_version, trajectory_id, shard,
    arg_min(task_id, step_index) AS task_id,
    arg_min(role, step_index) AS role,
    arg_min(reward, step_index) AS reward,
    arg_min(num_steps, step_index) AS num_steps,
    count(*) AS steps,
    sum(prompt_tokens)::BIGINT AS prompt_tokens,
    sum(response_tokens)::BIGINT AS response_tokens,
    min(policy_version) AS min_policy_version,
    max(policy_version) AS max_policy_version,
    arg_min(is_correct, step_index) AS is_correct,
    arg_min(termination_reason, step_index) AS termination_reason,
    bool_or(partial) AS partial,
    arg_min(filter_reason, step_index) AS filter_reason,
    arg_min(advantage, step_index) AS advantage,
    arg_min(estimator, step_index) AS estimator,
    arg_min(group_size, step_index) AS group_size,
    arg_min(expected_group_size, step_index) AS expected_group_size
  FROM stored_steps
  GROUP BY group_id, group_version, trajectory_id, shard
)
-- The first shard's fold: arg_min_null keeps a NULL of that shard rather
-- than take another shard's value (one row per shard: no ties).
SELECT group_id, group_version, trajectory_id,
  arg_min_null(task_id, shard) AS task_id,
  arg_min_null(role, shard) AS role,
  arg_min_null(reward, shard) AS reward,
  arg_min_null(num_steps, shard) AS num_steps,
  arg_min_null(steps, shard) AS steps,
  arg_min_null(prompt_tokens, shard) AS prompt_tokens,
  arg_min_null(response_tokens, shard) AS response_tokens,
  arg_min_null(min_policy_version, shard) AS min_policy_version,
  arg_min_null(max_policy_version, shard) AS max_policy_version,
  arg_min_null(is_correct, shard) AS is_correct,
  arg_min_null(termination_reason, shard) AS termination_reason,
  arg_min_null(partial, shard) AS partial,
  arg_min_null(filter_reason, shard) AS filter_reason,
  arg_min_null(advantage, shard) AS advantage,
  arg_min_null(estimator, shard) AS estimator,
  arg_min_null(group_size, shard) AS group_size,
  arg_min_null(expected_group_size, shard) AS expected_group_size,
  min(shard) AS shard,
  coalesce(arg_min_null(is_correct, shard), arg_min_null(reward, shard) > 0) AS pass
FROM per_shard
GROUP BY group_id, group_version, trajectory_id;
`

// promptForksSQL is the prompt_forks view: PromptForksOver every step.
var promptForksSQL = "CREATE OR REPLACE VIEW prompt_forks AS\n" + PromptForksOver("steps") + ";\n"

// PromptForksOver finds the steps of rel (a relation with the steps
// view's columns, whole prompts) that do not extend their predecessor
// (the rule of schemas/prefix.Extends: the prompt begins with the
// previous step's prompt followed by its response), and where they
// diverge: fork_at, the common prefix's length. The live view's
// trajectory page runs it over one trajectory's steps.
func PromptForksOver(rel string) string {
	return `WITH walk AS (
  SELECT group_id, group_version, trajectory_id, step_id, step_index, shard, prompt_ids,
    list_concat(lag(prompt_ids) OVER w, lag(response_ids) OVER w) AS prev_ids
  FROM ` + rel + `
  WINDOW w AS (PARTITION BY group_id, group_version, trajectory_id ORDER BY step_index)
)
SELECT group_id, group_version, trajectory_id, step_id, step_index, shard,
  coalesce(list_position(list_transform(range(1, least(len(prompt_ids), len(prev_ids)) + 1), i -> prompt_ids[i] != prev_ids[i]), true) - 1,
    least(len(prompt_ids), len(prev_ids)))::BIGINT AS fork_at,
  len(prev_ids)::BIGINT AS prev_tokens, len(prompt_ids)::BIGINT AS prompt_tokens
FROM walk
WHERE prev_ids IS NOT NULL AND len(prev_ids) > 0
  AND NOT (len(prompt_ids) >= len(prev_ids) AND prompt_ids[1:len(prev_ids)] = prev_ids)`
}

// stepVersionsSQL reads stored_steps (no prompt is rebuilt). The oldest
// version is schemas.Step.OldestVersion's rule: the least of the step's
// version and its tokens'.
const stepVersionsSQL = `CREATE OR REPLACE VIEW step_versions AS
SELECT group_id, group_version, trajectory_id, step_id, step_index, shard, policy_version,
  least(policy_version, coalesce(list_min(token_versions), policy_version)) AS oldest_version,
  greatest(policy_version, coalesce(list_max(token_versions), policy_version)) AS newest_version,
  coalesce(token_versions, list_transform(response_ids, x -> policy_version)) AS response_versions,
  coalesce(list_transform(list_filter(range(1, len(token_versions)), i -> token_versions[i + 1] != token_versions[i]),
    i -> {'at': i, 'version': token_versions[i + 1]}), []) AS version_changes,
  finish_reason
FROM stored_steps;
`

// stepSamplingSQL reads metadata.sampling (train.SamplingRequirement
// reads the same object): the gateway's max_tokens under whichever name
// the request used.
const stepSamplingSQL = `CREATE OR REPLACE VIEW step_sampling AS
WITH m AS (
  SELECT group_id, group_version, trajectory_id, step_id, step_index, shard,
    json_extract(CASE WHEN json_valid(metadata) THEN metadata END, '$.sampling') AS s
  FROM stored_steps
)
SELECT group_id, group_version, trajectory_id, step_id, step_index, shard,
  TRY_CAST(json_extract_string(s, '$.temperature') AS DOUBLE) AS temperature,
  TRY_CAST(json_extract_string(s, '$.top_p') AS DOUBLE) AS top_p,
  TRY_CAST(json_extract_string(s, '$.top_k') AS BIGINT) AS top_k,
  TRY_CAST(json_extract_string(s, '$.min_p') AS DOUBLE) AS min_p,
  TRY_CAST(coalesce(json_extract_string(s, '$.max_tokens'), json_extract_string(s, '$.max_completion_tokens'),
    json_extract_string(s, '$.max_new_tokens')) AS BIGINT) AS max_tokens,
  TRY_CAST(json_extract_string(s, '$.seed') AS BIGINT) AS seed,
  json_extract_string(s, '$.logprobs_mode') AS logprobs_mode,
  s::VARCHAR AS sampling
FROM m;
`

const groupsSQL = `CREATE OR REPLACE VIEW groups AS
SELECT group_id, group_version,
  arg_min(task_id, {'s': shard, 't': trajectory_id}) AS task_id,
  arg_min(role, {'s': shard, 't': trajectory_id}) AS role,
  count(*) AS trajectories,
  sum(steps)::BIGINT AS steps,
  avg(reward) AS reward_mean,
  stddev_pop(reward) AS reward_std,
  min(reward) AS reward_min,
  max(reward) AS reward_max,
  count(*) FILTER (WHERE pass) AS passes,
  bool_or(partial) AS partial,
  arg_min(group_size, {'s': shard, 't': trajectory_id}) AS group_size,
  arg_min(expected_group_size, {'s': shard, 't': trajectory_id}) AS expected_group_size,
  min(shard) AS shard
FROM trajectories
GROUP BY group_id, group_version;
`

// deadLetterColumns is the JSON form of schemas.DeadLetterLine.
const deadLetterColumns = `{'reason': 'VARCHAR', 'error': 'VARCHAR', ` +
	`'source': 'STRUCT("file" VARCHAR, "line" BIGINT, "topic" VARCHAR, "partition" INTEGER, "offset" BIGINT)', ` +
	`'record': 'VARCHAR', 'record_encoding': 'VARCHAR', 'truncated': 'BOOLEAN', 'size': 'BIGINT'}`

// deadLettersSQL reads the committed dead-letter lines. The source
// position fields are omitted from the JSON when zero, so a Kafka record
// at partition 0 or offset 0 reads them back as 0.
func (l *layout) deadLettersSQL() string {
	var b strings.Builder
	b.WriteString("CREATE OR REPLACE VIEW dead_letters AS\n")
	if len(l.dlq) == 0 {
		b.WriteString("SELECT NULL::VARCHAR AS reason, NULL::VARCHAR AS error, NULL::VARCHAR AS stream, NULL::BIGINT AS position,\n")
		b.WriteString("  NULL::VARCHAR AS source_file, NULL::BIGINT AS source_line, NULL::VARCHAR AS source_topic,\n")
		b.WriteString("  NULL::INTEGER AS source_partition, NULL::BIGINT AS source_offset, NULL::VARCHAR AS record,\n")
		b.WriteString("  NULL::VARCHAR AS record_encoding, NULL::BOOLEAN AS truncated, NULL::BIGINT AS size, NULL::VARCHAR AS dlq_file\nWHERE false;\n")
		return b.String()
	}
	longest := 16 << 20 // DuckDB's default
	for _, d := range l.dlq {
		longest = max(longest, d.longest+1024)
	}
	b.WriteString(`SELECT reason, error,
  CASE WHEN source.topic IS NOT NULL THEN source.topic || '/' || coalesce(source."partition", 0) ELSE source.file END AS stream,
  CASE WHEN source.topic IS NOT NULL THEN coalesce(source."offset", 0) ELSE source.line END AS position,
  source.file AS source_file, source.line AS source_line, source.topic AS source_topic,
  CASE WHEN source.topic IS NOT NULL THEN coalesce(source."partition", 0) END AS source_partition,
  CASE WHEN source.topic IS NOT NULL THEN coalesce(source."offset", 0) END AS source_offset,
  record, record_encoding, coalesce(truncated, false) AS truncated, size, f.dlq_file
FROM read_json([
`)
	for i, d := range l.dlq {
		b.WriteString("  " + sqlString(d.file))
		if i < len(l.dlq)-1 {
			b.WriteString(",")
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "], format = 'newline_delimited', filename = true, maximum_object_size = %d,\n  columns = %s) AS d\n",
		longest, deadLetterColumns)
	b.WriteString("JOIN (VALUES\n")
	for i, d := range l.dlq {
		fmt.Fprintf(&b, "  (%s, %s)", sqlString(d.file), sqlString(d.rel))
		if i < len(l.dlq)-1 {
			b.WriteString(",")
		}
		b.WriteString("\n")
	}
	b.WriteString(") AS f(filename, dlq_file) ON f.filename = d.filename;\n")
	return b.String()
}

// deadLetterCommitsSQL lists the counts Open made while reading the
// committed dead letters (attributeDeadLetters): the manifest's marks
// are not in the files, so the counts come in as values.
func (l *layout) deadLetterCommitsSQL() string {
	var rows []string
	for _, d := range l.dlq {
		for _, c := range d.commits {
			at := "NULL"
			if !c.at.IsZero() {
				at = sqlString(c.at.UTC().Format(time.RFC3339Nano))
			}
			rows = append(rows, fmt.Sprintf("  (%d, %s, %s, %s, %d)", c.seq, at, sqlString(c.file), sqlString(c.reason), c.letters))
		}
	}
	const head = "CREATE OR REPLACE VIEW dead_letter_commits AS\n"
	if len(rows) == 0 {
		return head + "SELECT NULL::BIGINT AS seq, NULL::TIMESTAMPTZ AS committed_at, NULL::VARCHAR AS dlq_file, NULL::VARCHAR AS reason,\n" +
			"  NULL::BIGINT AS dead_letters\nWHERE false;\n"
	}
	return head + "SELECT seq::BIGINT AS seq, committed_at::TIMESTAMPTZ AS committed_at, dlq_file::VARCHAR AS dlq_file, reason::VARCHAR AS reason,\n" +
		"  dead_letters::BIGINT AS dead_letters\nFROM (VALUES\n" + strings.Join(rows, ",\n") + "\n) AS t(seq, committed_at, dlq_file, reason, dead_letters);\n"
}

// itoa is strconv.Itoa for report SQL.
func itoa(n int) string { return strconv.Itoa(n) }

// consumedColumns are the fields of a consumed line, as Go writes them.
const consumedColumns = `{consumer_group: 'VARCHAR', train_step: 'BIGINT', position: 'INTEGER', groups_in_batch: 'INTEGER',
  member: 'VARCHAR', member_id: 'VARCHAR', batch_id: 'UBIGINT', policy_version: 'BIGINT', group_id: 'VARCHAR',
  group_version: 'BIGINT', trajectories: 'INTEGER', steps: 'BIGINT', shard: 'VARCHAR', group_ordinal: 'INTEGER',
  log_seq: 'BIGINT', acked_at: 'TIMESTAMP'}`

// consumedCols are the consumed table's columns, from a consumed line's.
const consumedCols = `consumer_group, train_step, position, groups_in_batch, member, member_id, batch_id, policy_version,
  group_id, group_version, greatest(policy_version - group_version, 0) AS staleness, trajectories, steps, shard, group_ordinal, log_seq, acked_at`

// consumedSQL materialises the consumed rows into a table: the file is
// read once, before the sandbox closes, so it need not be allowed after.
func (l *layout) consumedSQL() string {
	const cols = consumedCols
	if l.consumed == "" {
		return "CREATE OR REPLACE TABLE consumed AS\nSELECT " + cols + "\nFROM (SELECT NULL::VARCHAR AS consumer_group, NULL::BIGINT AS train_step, NULL::INTEGER AS position,\n" +
			"  NULL::INTEGER AS groups_in_batch, NULL::VARCHAR AS member, NULL::VARCHAR AS member_id, NULL::UBIGINT AS batch_id,\n" +
			"  NULL::BIGINT AS policy_version, NULL::VARCHAR AS group_id, NULL::BIGINT AS group_version, NULL::INTEGER AS trajectories,\n" +
			"  NULL::BIGINT AS steps, NULL::VARCHAR AS shard, NULL::INTEGER AS group_ordinal, NULL::BIGINT AS log_seq,\n" +
			"  NULL::TIMESTAMP AS acked_at) WHERE false;\n"
	}
	return "CREATE OR REPLACE TABLE consumed AS\nSELECT " + cols + "\nFROM read_json(" + sqlString(l.consumed) +
		", format = 'newline_delimited',\n  columns = " + consumedColumns + ")\nORDER BY consumer_group, train_step, position;\n"
}
