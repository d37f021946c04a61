package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// duckResult is what the DuckDB child prints on stdout.
type duckResult struct {
	Rows         int64   `json:"rows"`
	QuerySeconds float64 `json:"query_seconds"`
}

// duckChild is the hidden `duckdb` mode: one COPY statement on an
// in-memory DuckDB with its defaults (all cores, no memory limit).
func duckChild(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet(duckMode, flag.ContinueOnError)
	in := fs.String("in", "", "JSON-lines input")
	out := fs.String("out", "", "Parquet output file")
	profile := fs.String("profile", "", "write DuckDB's JSON query profile here")
	plan := fs.String("plan", "one-scan", "query shape: one-scan or two-scans (see duckSQLPlan)")
	copyOpts := fs.String("copy-options", "", "extra COPY options, e.g. \"ROW_GROUP_SIZE 16384\"")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *in == "" || *out == "" {
		return fmt.Errorf("--in and --out are required")
	}
	db, err := sql.Open("duckdb", "")
	if err != nil {
		return err
	}
	defer db.Close()
	// One connection: profiling settings are per connection.
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if *profile != "" {
		for _, s := range []string{"PRAGMA enable_profiling = 'json'", "PRAGMA profiling_output = " + sqlString(*profile)} {
			if _, err := conn.ExecContext(ctx, s); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
	}
	q, err := duckSQLPlan(*plan, *in, *out, *copyOpts)
	if err != nil {
		return err
	}
	start := time.Now()
	res, err := conn.ExecContext(ctx, q)
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(duckResult{Rows: n, QuerySeconds: time.Since(start).Seconds()})
}

// Wire columns read by DuckDB, with their types (schemas/README.md).
// Steps and trajectories share one file, so both sets are read as one
// table; the fields a record lacks are NULL.
var (
	metaColumns = [][2]string{
		{"type", "VARCHAR"}, {"task_id", "VARCHAR"}, {"group_id", "VARCHAR"}, {"role", "VARCHAR"},
		{"trajectory_id", "VARCHAR"}, {"policy_version", "BIGINT"}, {"reward", "DOUBLE"},
		{"num_steps", "INTEGER"}, {"termination_reason", "VARCHAR"}, {"is_correct", "BOOLEAN"},
		{"metadata", "JSON"}, {"signals", "MAP(VARCHAR, DOUBLE)"},
	}
	stepColumns = [][2]string{
		{"type", "VARCHAR"}, {"step_id", "VARCHAR"}, {"task_id", "VARCHAR"}, {"role", "VARCHAR"},
		{"trajectory_id", "VARCHAR"}, {"step_index", "INTEGER"}, {"policy_version", "BIGINT"},
		{"prompt_ids", "INTEGER[]"}, {"response_ids", "INTEGER[]"}, {"response_logprobs", "FLOAT[]"},
		{"token_versions", "BIGINT[]"}, {"teacher_logprobs", "FLOAT[]"}, {"messages", "JSON"},
		{"reward", "DOUBLE"}, {"done", "BOOLEAN"}, {"finish_reason", "VARCHAR"}, {"model", "VARCHAR"},
		{"created_at", "TIMESTAMPTZ"}, {"metadata", "JSON"},
	}
)

func readJSON(in string, cols ...[][2]string) string {
	seen := map[string]bool{}
	var parts []string
	for _, set := range cols {
		for _, c := range set {
			if !seen[c[0]] {
				seen[c[0]] = true
				parts = append(parts, sqlString(c[0])+": "+sqlString(c[1]))
			}
		}
	}
	return fmt.Sprintf("read_json(%s, format = 'newline_delimited', columns = {%s})", sqlString(in), strings.Join(parts, ", "))
}

// groupKey is the wire rule: group_id, else task_id, or task_id:role with
// a role.
const groupKey = `coalesce(group_id, CASE WHEN role IS NULL THEN task_id ELSE task_id || ':' || role END)`

// selectRows is the output: one row per step with its trajectory's and
// group's values, the columns of rllm-pipe's shards except lineage
// (source_file and source_line: read_json has no line numbers; the Kafka
// ones are null for files) and token_advantages and filter_reason (null
// in this job). GRPO in rLLM's convention: (r - mean) / (population std
// + 1e-6) over the group's trajectory rewards; a group of one has mean 0
// and std 1.
const selectRows = `
SELECT t.group_key AS group_id, s.task_id, s.role, s.trajectory_id, s.step_id, s.step_index,
       t.num_steps, s.policy_version, g.group_version,
       s.prompt_ids, s.response_ids, s.response_logprobs, s.token_versions, s.teacher_logprobs,
       CAST(s.messages AS VARCHAR) AS messages,
       t.reward, s.reward AS step_reward,
       CASE WHEN g.n = 1 THEN t.reward / (1 + 1e-6)
            ELSE (t.reward - g.mean) / (g.std + 1e-6) END AS advantage,
       CAST(g.n AS INTEGER) AS group_size, CAST(g.n AS INTEGER) AS expected_group_size, false AS partial,
       s.finish_reason, t.termination_reason, s.done, t.is_correct, s.model, s.created_at,
       CAST(s.metadata AS VARCHAR) AS metadata, CAST(t.metadata AS VARCHAR) AS trajectory_metadata, t.signals,
       'grpo/rllm' AS estimator
FROM steps s
JOIN traj t USING (trajectory_id)
JOIN grp g ON g.group_key = t.group_key`

const trajAndGroups = `
traj AS (
  SELECT trajectory_id, group_key, reward, num_steps, termination_reason, is_correct, metadata, signals
  FROM meta WHERE "type" = 'trajectory'
),
grp AS (
  SELECT group_key,
         count(*) FILTER (WHERE "type" = 'trajectory') AS n,
         avg(reward) FILTER (WHERE "type" = 'trajectory') AS mean,
         stddev_pop(reward) FILTER (WHERE "type" = 'trajectory') AS std,
         min(policy_version) FILTER (WHERE "type" = 'step') AS group_version
  FROM meta GROUP BY group_key
)`

// duckSQLPlan writes the DuckDB job in one of two shapes:
//
//   - one-scan: the file is read once into a materialised CTE that both
//     the group statistics and the output read;
//   - two-scans: a narrow scan (ids, rewards, versions) builds the
//     trajectory and group tables, then a second scan streams the steps
//     through the joins into the Parquet writer.
//
// Both keep DuckDB's settings; one-scan was the faster on the benchmark's
// input (parsing dominates, and two-scans parses every line twice).
// copyOpts are extra options of the COPY statement (none by default:
// DuckDB's own Parquet settings).
func duckSQLPlan(plan, in, out, copyOpts string) (string, error) {
	var with string
	switch plan {
	case "two-scans":
		with = fmt.Sprintf(`
WITH meta AS MATERIALIZED (
  SELECT "type", trajectory_id, %s AS group_key, reward, policy_version, num_steps,
         termination_reason, is_correct, metadata, signals
  FROM %s
),%s,
steps AS (
  SELECT * FROM %s WHERE "type" = 'step'
)`, groupKey, readJSON(in, metaColumns), trajAndGroups, readJSON(in, stepColumns))
	case "one-scan":
		with = fmt.Sprintf(`
WITH raw AS MATERIALIZED (
  SELECT *, %s AS group_key FROM %s
),
meta AS (SELECT * FROM raw),%s,
steps AS (
  SELECT * FROM raw WHERE "type" = 'step'
)`, groupKey, readJSON(in, stepColumns, metaColumns), trajAndGroups)
	default:
		return "", fmt.Errorf("unknown --plan %q", plan)
	}
	opts := "FORMAT parquet, COMPRESSION zstd"
	if strings.TrimSpace(copyOpts) != "" {
		opts += ", " + copyOpts
	}
	return fmt.Sprintf("COPY (%s%s\n) TO %s (%s)", with, selectRows, sqlString(out), opts), nil
}

// printProfile lists the busiest operators of a DuckDB JSON profile.
func printProfile(w io.Writer, pair int, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var root map[string]any
	if err := json.Unmarshal(b, &root); err != nil {
		return err
	}
	type op struct {
		name  string
		secs  float64
		card  float64
		extra string
	}
	var ops []op
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		name, _ := n["operator_name"].(string)
		if name == "" {
			name, _ = n["operator_type"].(string)
		}
		if t, ok := n["operator_timing"].(float64); ok && name != "" {
			card, _ := n["operator_cardinality"].(float64)
			var extra string
			if ei, ok := n["extra_info"].(map[string]any); ok {
				if p, ok := ei["Projections"].([]any); ok {
					extra = fmt.Sprintf("%d columns", len(p))
				}
			}
			ops = append(ops, op{strings.TrimSpace(name), t, card, extra})
		}
		if ch, ok := n["children"].([]any); ok {
			for _, c := range ch {
				if m, ok := c.(map[string]any); ok {
					walk(m)
				}
			}
		}
	}
	walk(root)
	sort.Slice(ops, func(i, j int) bool { return ops[i].secs > ops[j].secs })
	latency, _ := root["latency"].(float64)
	cpu, _ := root["cpu_time"].(float64)
	peak, _ := root["system_peak_buffer_memory"].(float64)
	fmt.Fprintf(w, "\nDuckDB profile, pair %d (%s):\n  latency %.2f s, operator CPU %.2f s, peak buffer memory %s; busiest operators:\n",
		pair, path, latency, cpu, mib(int64(peak)))
	for i, o := range ops {
		if i == 8 {
			break
		}
		fmt.Fprintf(w, "  %-22s %-16s %8.2f s  %10.0f rows\n", o.name, o.extra, o.secs, o.card)
	}
	return nil
}
