package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/rllm-pipe/rllm-pipe/cmd/internal/cli"
	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb"
	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb/report"
)

// reportOpts are the flags of `rllm-pipe report`.
type reportOpts struct {
	from, out   string
	k           []int
	downloadDir string
	conn        connFlags
}

func newReportCmd(soft context.Context) *cobra.Command {
	var o reportOpts
	cmd := &cobra.Command{
		Use:   "report --from URL --to report.html",
		Short: "Write one self-contained HTML file of charts of the committed data",
		Long: `report opens the committed data of an ingest output (a path, file:///path or
s3://bucket/prefix) as sql does (read only, the same views) and writes one
HTML file with charts: mean reward, pass rate and pass@k by policy version;
staleness and advantage distributions; prompt and response tokens by
version; filtered groups and dead letters by reason (a trajectory several
filters marked counts under each of its reasons); rows committed over
commit time; reward by role when roles exist. Every figure is a named
report of "rllm-pipe sql --report" (the same query).

The file is self-contained: inline SVG and CSS, no script, no request (its
Content-Security-Policy allows none); it holds aggregates, not rows, so its
size does not grow with the number of steps. Light and dark themes follow
the system's.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runReport(soft, o, cmd)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.from, "from", "", "committed shards: an ingest output root (path, file:///path) or s3://bucket/prefix")
	f.StringVar(&o.out, "to", "report.html", "the HTML file to write (- for stdout)")
	cli.Rename(f, "out", "to")
	f.IntSliceVar(&o.k, "k", []int{1, 2, 4, 8}, "the k of pass@k")
	f.StringVar(&o.downloadDir, "download-dir", "", "keep the local copies of S3 shards here (default: a temporary folder removed on exit)")
	o.conn.register(f)
	return cmd
}

func runReport(ctx context.Context, o reportOpts, cmd *cobra.Command) (err error) {
	if o.from == "" {
		return usageErrorf("--from is required")
	}
	if o.out == "" {
		return usageErrorf("--to is required")
	}
	if err := checkOutputFiles(ctx, []string{o.from}, "to", o.out, "download-dir", o.downloadDir); err != nil {
		return err
	}
	db, err := openSQL(ctx, sqlOpts{from: o.from, downloadDir: o.downloadDir, conn: o.conn, progress: progressTo(cmd.ErrOrStderr())})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := db.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close: %w", cerr)
		}
	}()
	printWarnings(cmd.ErrOrStderr(), "report", db.Warnings())
	d, err := report.Collect(ctx, db, duckdb.ReportOptions{K: o.k})
	if err != nil {
		return sqlError(err)
	}
	d.Source, d.Shards = o.from, db.Shards()
	var buf bytes.Buffer
	if err := report.Write(&buf, d); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if o.out == "-" {
		_, err := cmd.OutOrStdout().Write(buf.Bytes())
		return err
	}
	// Write beside, then rename: a reader never sees half a report.
	tmp, err := os.CreateTemp(filepath.Dir(o.out), ".report-*.html")
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if _, err := tmp.Write(buf.Bytes()); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("report: %w", err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("report: %w", err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("report: %w", err)
	}
	if err := os.Rename(tmp.Name(), o.out); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("report: %w", err)
	}
	if !globals.Quiet {
		fmt.Fprintf(cmd.ErrOrStderr(), "rllm-pipe report: wrote %s (%d bytes, %d shards)\n", o.out, buf.Len(), db.Shards())
	}
	return nil
}
