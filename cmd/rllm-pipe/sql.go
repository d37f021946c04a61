package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/spf13/cobra"

	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb"
	"github.com/rllm-pipe/rllm-pipe/train"
)

// sqlOpts are the flags of `rllm-pipe sql`.
type sqlOpts struct {
	from        string
	report      string
	k           []int
	format      string
	viewsSQL    bool
	downloadDir string
	hostFiles   bool
	conn        connFlags
	// progress, when set (stderr), shows the download of S3 shards on a
	// terminal.
	progress io.Writer
}

func newSQLCmd(soft context.Context) *cobra.Command {
	var o sqlOpts
	cmd := &cobra.Command{
		Use:   "sql --from URL [QUERY | --report NAME]",
		Short: "Query committed shards with DuckDB (views, named reports)",
		Long: `sql opens an in-memory DuckDB over the committed data of an ingest output
(a path, file:///path or s3://bucket/prefix) and runs QUERY (- reads it from
stdin), or a named --report; with neither it lists the views, their columns
and the reports. Only what the manifest commits is visible: the shards it
lists (never a folder glob) and the committed lines of the dead letters.
S3 shards are downloaded to a temporary folder first (removed on exit, or
kept in --download-dir).

Read only: once the views exist, DuckDB can open no file but the committed
shards and dead letters they read — no other host file (read_csv,
read_text, glob, COPY, ATTACH, EXPORT DATABASE), no URL, no extension to
install or load — and its settings are locked (SET, RESET and PRAGMA cannot
undo this). QUERY must be one query: SELECT (with FROM, WITH, VALUES,
DESCRIBE, SHOW, SUMMARIZE, PIVOT … IN (…)) or EXPLAIN of one; COPY, ATTACH,
INSTALL, LOAD, SET, CREATE and every other statement is refused (exit 2).
Nothing is written to the output root or anywhere else but the temporary
folder. --allow-host-files lifts all of this, for joining your own files:
the query may then read and write any file you can, reach the network and
install extensions.

Views: steps (every committed row, whole prompts), stored_steps (the rows
as stored, with prompt_tokens and response_tokens: cheap, no prompt
rebuilt), trajectories, groups, shards (the manifest), dead_letters,
dead_letter_commits (per manifest entry and reason, the dead letters it
committed), consumed (what every consumer group acknowledged: one row per
group of each batch, with train_step, policy_version and staleness). A
trajectory passes when coalesce(is_correct, reward > 0).

Reports: reward-by-version, pass-at-k (--k), staleness, token-lengths,
advantage, dead-letters, and those behind the charts of rllm-pipe report:
pass-at-k-by-version, token-lengths-by-version, advantage-histogram,
filtered-by-version, filtered-over-time, dead-letters-over-time,
throughput, roles. --views-sql prints the view definitions (and the
query or report, if given) for the DuckDB CLI.

--format table escapes control characters (ESC, CR, other C0 and C1
controls, bidirectional overrides) so that values cannot drive the
terminal; jsonl escapes them as JSON (\u001b); csv is exact, for programs,
and carries them as they are.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runSQL(soft, o, args, cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.from, "from", "", "committed shards: an ingest output root (path, file:///path) or s3://bucket/prefix")
	f.StringVar(&o.report, "report", "", "run a named report: "+strings.Join(reportNames(), ", "))
	f.IntSliceVar(&o.k, "k", []int{1, 2, 4, 8}, "the k of --report pass-at-k")
	f.StringVar(&o.format, "format", duckdb.FormatTable, "output: table (aligned, for terminals), csv or jsonl")
	f.BoolVar(&o.viewsSQL, "views-sql", false, "print the CREATE VIEW statements (over absolute local paths) for the DuckDB CLI instead of running anything")
	f.StringVar(&o.downloadDir, "download-dir", "", "keep the local copies here: S3 shards and dead letters, a compaction snapshot, the committed part of a dead-letter file being written, the consumer groups' acknowledgements (default: a temporary folder removed on exit; not under the root read)")
	f.BoolVar(&o.hostFiles, "allow-host-files", false, "lift the read-only sandbox: the query may read and write any file you can (to join your own data), reach the network and install extensions")
	o.conn.register(f)
	return cmd
}

func reportNames() []string {
	var out []string
	for _, r := range duckdb.Reports() {
		out = append(out, r.Name)
	}
	return out
}

func runSQL(ctx context.Context, o sqlOpts, args []string, stdin io.Reader, stdout, stderr io.Writer) (err error) {
	if o.from == "" {
		return usageErrorf("--from is required")
	}
	if !validFormat(o.format) {
		return usageErrorf("--format %q: want %s", o.format, strings.Join(duckdb.Formats(), ", "))
	}
	query := strings.TrimSpace(strings.Join(args, " "))
	if query == "-" {
		data, err := io.ReadAll(stdin)
		if err != nil {
			return fmt.Errorf("read query from stdin: %w", err)
		}
		query = strings.TrimSpace(string(data))
		if query == "" {
			return usageErrorf("empty query on stdin")
		}
	}
	if query != "" && o.report != "" {
		return usageErrorf("give a QUERY or --report, not both")
	}
	if o.report != "" {
		q, err := duckdb.Report(o.report, duckdb.ReportOptions{K: o.k})
		if err != nil {
			return usageErrorf("--report: %v", err)
		}
		query = q
	}
	isS3 := strings.HasPrefix(o.from, "s3://")
	if o.viewsSQL && isS3 && o.downloadDir == "" {
		return usageErrorf("--views-sql over S3 needs --download-dir: the views name local copies, which are removed on exit otherwise")
	}

	if err := checkOutputFiles(ctx, []string{o.from}, "download-dir", o.downloadDir); err != nil {
		return err
	}
	if !globals.Quiet {
		o.progress = stderr
	}
	db, err := openSQL(ctx, o)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := db.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close: %w", cerr)
		}
	}()
	printWarnings(stderr, "sql", db.Warnings())

	if o.viewsSQL {
		out, err := db.ViewsSQL()
		if errors.Is(err, duckdb.ErrViewsNeedCopies) {
			return usageErrorf("--views-sql: %v: give --download-dir to keep them", err)
		} else if err != nil {
			return err
		}
		if query != "" {
			what := "query"
			if o.report != "" {
				what = "report " + o.report
			}
			out += "\n-- " + what + "\n" + strings.TrimSuffix(query, ";") + ";\n"
		}
		_, err = io.WriteString(stdout, out)
		return err
	}
	if query == "" {
		return listViews(ctx, db, o.format, stdout)
	}
	rows, err := db.Query(ctx, query)
	if err != nil {
		return sqlError(err)
	}
	defer rows.Close()
	if _, err := duckdb.WriteRows(stdout, rows, o.format); err != nil {
		return sqlError(err)
	}
	return nil
}

func validFormat(f string) bool {
	for _, x := range duckdb.Formats() {
		if f == x {
			return true
		}
	}
	return false
}

// sqlError makes a query DuckDB or the sandbox refused a usage error
// (exit 2).
func sqlError(err error) error {
	if errors.Is(err, duckdb.ErrRefused) {
		return &exitError{Code: exitUsage, Err: fmt.Errorf("%w (sql is read only and reads only the committed data; --allow-host-files lifts this)", err)}
	}
	if errors.Is(err, duckdb.ErrBadQuery) {
		return &exitError{Code: exitUsage, Err: err}
	}
	return err
}

// printWarnings prints what opening the views warned of, made safe for a
// terminal (a warning can quote a record's text).
func printWarnings(w io.Writer, command string, warnings []string) {
	for _, msg := range warnings {
		fmt.Fprintf(w, "rllm-pipe %s: warning: %s\n", command, duckdb.TerminalSafe(msg))
	}
}

// openSQL opens the views over --from, read only.
func openSQL(ctx context.Context, o sqlOpts) (*duckdb.DB, error) {
	r, err := openShardStore(ctx, o.from, o.conn)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	opts := duckdb.Options{DownloadDir: o.downloadDir, AllowHostFiles: o.hostFiles, ConsumerGroups: train.ConsumerLogs{}}
	if o.progress != nil {
		var (
			mu   sync.Mutex
			bar  *progress
			most int64
		)
		opts.Progress = func(done, total int64) {
			mu.Lock()
			defer mu.Unlock()
			if bar == nil {
				if total == 0 {
					return // nothing to download
				}
				bar = newProgress(o.progress, "download", total, true, false)
			}
			most = max(most, done) // shards land in any order
			bar.update(most, total)
		}
		defer func() {
			if bar != nil {
				bar.finish()
			}
		}()
	}
	return duckdb.Open(ctx, r, opts)
}

// listViews prints the views with their columns, then the reports: a
// readable listing for the table format, rows (kind, name, column, type,
// doc) for csv and jsonl.
func listViews(ctx context.Context, db *duckdb.DB, format string, w io.Writer) error {
	type row struct{ kind, name, column, typ, doc string }
	var rows []row
	for _, v := range db.Views() {
		cols, err := db.Columns(ctx, v.Name)
		if err != nil {
			return err
		}
		for _, c := range cols {
			rows = append(rows, row{"view", v.Name, c.Name, c.Type, v.Doc})
		}
	}
	for _, r := range duckdb.Reports() {
		rows = append(rows, row{"report", r.Name, "", "", r.Doc})
	}
	if format != duckdb.FormatTable {
		q := "SELECT * FROM (VALUES "
		var args []any
		for i, r := range rows {
			if i > 0 {
				q += ", "
			}
			q += "(?::VARCHAR, ?::VARCHAR, ?::VARCHAR, ?::VARCHAR, ?::VARCHAR)"
			args = append(args, r.kind, r.name, nullIfEmpty(r.column), nullIfEmpty(r.typ), r.doc)
		}
		q += ") AS t(kind, name, \"column\", type, doc)"
		res, err := db.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		defer res.Close()
		_, err = duckdb.WriteRows(w, res, format)
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Views (%d committed shards):\n", db.Shards())
	last := ""
	for _, r := range rows {
		if r.kind != "view" {
			continue
		}
		if r.name != last {
			fmt.Fprintf(&b, "\n%s: %s\n", r.name, r.doc)
			last = r.name
		}
		fmt.Fprintf(&b, "  %-22s %s\n", r.column, r.typ)
	}
	b.WriteString("\nReports (--report NAME):\n")
	for _, r := range duckdb.Reports() {
		fmt.Fprintf(&b, "  %-18s %s\n", r.Name, r.Doc)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}
