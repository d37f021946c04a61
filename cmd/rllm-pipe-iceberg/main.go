// Command rllm-pipe-iceberg projects a root's committed shards into
// Apache Iceberg tables. It is what `rllm-pipe iceberg` and ingest's
// --iceberg-catalog run: an executable of its own, so that rllm-pipe
// starts without iceberg-go's package initialisation (its expression
// library builds tens of megabytes of tables at start-up), paid only by
// the runs that use Iceberg. It is installed beside rllm-pipe.
//
// This package is cobra wiring only.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/apache/iceberg-go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/rllm-pipe/rllm-pipe/cmd/internal/cli"
	"github.com/rllm-pipe/rllm-pipe/connectors"
	icebergsync "github.com/rllm-pipe/rllm-pipe/connectors/iceberg"
)

func main() {
	args := append([]string{"iceberg"}, os.Args[1:]...)
	os.Exit(cli.Run(context.Background(), "rllm-pipe iceberg", newRoot, args, os.Stdout, os.Stderr))
}

// newRoot is "rllm-pipe" holding the one command "iceberg", and the
// arguments go to "iceberg": help and errors then name the commands as
// users type them through rllm-pipe (rllm-pipe iceberg sync ...).
func newRoot(soft context.Context) *cobra.Command {
	top := &cobra.Command{Use: "rllm-pipe", SilenceUsage: true, SilenceErrors: true}
	var globals cli.Globals
	cli.Setup(top, &globals)
	ice := newIceberg(soft)
	top.AddCommand(ice)
	cli.AddVersion(ice, "rllm-pipe-iceberg") // after: its examples name the command path
	cli.RejectUnknownSubcommands(top)
	return top
}

// finishTimeout bounds the last sync of --follow after a stop.
const finishTimeout = 2 * time.Minute

// tableOpts say which root projects into which tables.
type tableOpts struct {
	from        string
	catalog     string
	catalogName string
	namespace   string
	warehouse   string
	s3          cli.S3Flags
}

func (o *tableOpts) register(f *pflag.FlagSet) {
	f.StringVar(&o.from, "from", "", "shard root: file:///path, a path, or s3://bucket/prefix")
	f.StringVar(&o.catalog, "catalog", "", "Iceberg catalog: a SQLite file (sqlite:///path.db, path.db), postgres://... or a REST catalog (http(s)://...)")
	f.StringVar(&o.catalogName, "catalog-name", icebergsync.DefaultCatalogName, "the catalog's name, as readers configure it")
	f.StringVar(&o.namespace, "namespace", "rllm", "namespace of the tables (dots separate levels)")
	f.StringVar(&o.warehouse, "warehouse", "", "where new tables keep their metadata (default: the root's _iceberg folder)")
	o.s3.Register(f)
}

type syncOpts struct {
	table    tableOpts
	maxFiles int
	follow   bool
	poll     time.Duration
	json     bool
	quiet    bool
	ready    string
}

type compactOpts struct {
	table    tableOpts
	target   string
	minFiles int
	maxFiles int
	json     bool
	quiet    bool
}

func newIceberg(soft context.Context) *cobra.Command {
	root := &cobra.Command{
		Use:           "iceberg",
		Short:         "Project committed shards into Apache Iceberg tables (Spark, Trino, pyiceberg)",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	var o syncOpts
	syncCmd := &cobra.Command{
		Use:   "sync --from URL --catalog URI",
		Short: "Add the committed shards not yet in the Iceberg tables, exactly once (no rewrite)",
		Long: `sync adds the root's committed shards to the Iceberg table NAMESPACE.steps as
they are (no rewrite: Iceberg takes its column statistics from their footers),
partitioned by group_version, and its dead letters to NAMESPACE.dead_letters.
Each snapshot records how many of the manifest's shards the table holds, so a
re-run, a second syncer or a crash adds nothing twice and skips nothing.

With --follow it keeps the tables in step with a running ingest: a sync at
once, then every --poll; stopped (SIGINT, SIGTERM), it syncs once more, so the
tables hold every commit made before the signal (a second signal stops at
once).

--catalog names the catalog: a SQLite file (sqlite:///path/catalog.db, or a
path ending in .db: created with its tables if absent, no service), PostgreSQL
(postgres://user@host/db, password from PGPASSWORD) or a REST catalog
(http(s)://host:port, token from ICEBERG_REST_TOKEN). Readers use the same
catalog name (--catalog-name) and the table's location.

Example:
  rllm-pipe iceberg sync --from ./data --catalog ./lake/catalog.db
  python -c 'from pyiceberg.catalog.sql import SqlCatalog; print(SqlCatalog("rllm", uri="sqlite:///lake/catalog.db").load_table("rllm.steps").scan().to_arrow().num_rows)'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runSync(soft, cmd, o)
		},
	}
	f := syncCmd.Flags()
	o.table.register(f)
	f.IntVar(&o.maxFiles, "max-files-per-commit", 1000, "most shards one snapshot adds")
	f.BoolVar(&o.follow, "follow", false, "keep syncing new commits until stopped")
	f.DurationVar(&o.poll, "poll", 2*time.Second, "with --follow, how often to look for new commits")
	f.BoolVar(&o.json, "json", false, "print each sync's result as a JSON line on stdout")
	f.BoolVar(&o.quiet, "quiet", false, "no summary on stderr")
	f.StringVar(&o.ready, "ready-file", "", "write the table's name to this file once the catalog is open")
	root.AddCommand(syncCmd)

	var c compactOpts
	compactCmd := &cobra.Command{
		Use:   "compact --from URL --catalog URI",
		Short: "Merge the steps table's small files by version, in one snapshot (the shards stay)",
		Long: `compact merges the small files the steps table lists (a long run's
thousands of shards) into files of about --target-size, partition by
partition (one policy version each), and replaces them in one snapshot:
readers see the same rows, in the same order within a trajectory, and query
planning opens far fewer files. The table's position is unchanged; a sync
that commits meanwhile makes the compaction start again, so nothing is lost
or doubled. The shards stay in the root (the manifest lists them); the merged
files live under the table's data folder. The snapshots before it still list
the shards: expire them as you would any table's (docs/iceberg.md).

Example:
  rllm-pipe iceberg compact --from ./data --catalog ./lake/catalog.db`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runCompact(cmd, c)
		},
	}
	f = compactCmd.Flags()
	c.table.register(f)
	f.StringVar(&c.target, "target-size", "128MiB", "size of a merged file; files of a quarter of it or more are left alone")
	f.IntVar(&c.minFiles, "min-files", 8, "fewest small files of a version worth merging")
	f.IntVar(&c.maxFiles, "max-files", 10000, "most files one compaction replaces")
	f.BoolVar(&c.json, "json", false, "print the result as a JSON line on stdout")
	f.BoolVar(&c.quiet, "quiet", false, "no summary on stderr")
	root.AddCommand(compactCmd)
	return root
}

func runSync(soft context.Context, cmd *cobra.Command, o syncOpts) error {
	if o.maxFiles < 1 || o.maxFiles > 100000 {
		return cli.UsageErrorf("--max-files-per-commit %d: 1 to 100000", o.maxFiles)
	}
	if o.poll <= 0 {
		return cli.UsageErrorf("--poll %s: positive", o.poll)
	}
	ctx := cmd.Context()
	sy, closeAll, err := o.table.open(ctx, o.maxFiles)
	if err != nil {
		return err
	}
	defer closeAll()
	if o.ready != "" {
		if err := writeReady(o.ready, strings.Join(sy.Table(), ".")); err != nil {
			return fmt.Errorf("--ready-file: %w", err)
		}
	}
	out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
	start := time.Now()
	report := func(res icebergsync.Result, err error) {
		if err != nil {
			fmt.Fprintf(errOut, "iceberg: %v; again in %s\n", err, o.poll)
			return
		}
		if o.json {
			b, _ := json.Marshal(res)
			fmt.Fprintln(out, string(b))
		}
		if !o.quiet && (!o.follow || res.Shards > 0) {
			printSync(errOut, sy, res, time.Since(start))
		}
		start = time.Now()
	}
	if !o.follow {
		res, err := sy.Sync(ctx)
		if err != nil {
			return err
		}
		report(res, nil)
		return nil
	}
	f := icebergsync.Follow(ctx, sy, o.poll, report)
	select {
	case <-soft.Done():
	case <-ctx.Done():
	}
	_, err = f.Finish(ctx, finishTimeout)
	return err
}

// open opens the root and the catalog, and a syncer of the one into the
// other; the function returned closes both.
func (o tableOpts) open(ctx context.Context, maxFiles int) (*icebergsync.Syncer, func(), error) {
	if o.catalog == "" {
		return nil, nil, cli.UsageErrorf("--catalog is required")
	}
	if err := o.s3.Check(); err != nil {
		return nil, nil, err
	}
	root, err := connectors.ParseRoot(o.from, o.s3.Options())
	if err != nil {
		return nil, nil, cli.UsageErrorf("--from: %v", err)
	}
	ns := strings.Split(o.namespace, ".")
	for _, part := range ns {
		if part == "" {
			return nil, nil, cli.UsageErrorf("--namespace %q: empty level", o.namespace)
		}
	}
	loc, err := icebergsync.LocationsOf(root, o.warehouse)
	if err != nil {
		return nil, nil, cli.UsageErrorf("%v", err)
	}
	catProps := iceberg.Properties{}
	for k, v := range loc.Props {
		catProps[k] = v
	}
	location := ""
	rest := strings.HasPrefix(o.catalog, "http://") || strings.HasPrefix(o.catalog, "https://")
	if !rest || o.warehouse != "" {
		// A REST catalog places tables in its own warehouse unless told.
		catProps["warehouse"] = loc.Warehouse
		location = strings.TrimSuffix(loc.Warehouse, "/") + "/" + strings.Join(ns, ".")
	}
	cat, err := icebergsync.OpenCatalog(ctx, o.catalog, o.catalogName, catProps)
	if errors.Is(err, icebergsync.ErrCatalogURI) {
		return nil, nil, cli.UsageErrorf("%v", err)
	}
	if err != nil {
		return nil, nil, err
	}
	r, err := connectors.OpenReader(ctx, root, "iceberg-"+time.Now().UTC().Format("20060102T150405.000000000Z"))
	if err != nil {
		_ = cat.Close()
		return nil, nil, err
	}
	closeAll := func() {
		_ = cat.Close()
		_ = r.Close()
	}
	sy, err := icebergsync.NewSyncer(cat, r, icebergsync.Config{Namespace: ns, Base: loc.Base, MaxFilesPerCommit: maxFiles, Location: location})
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return sy, closeAll, nil
}

func runCompact(cmd *cobra.Command, o compactOpts) error {
	target, err := cli.ParseBytes(o.target)
	if err != nil || target < 1<<20 || target > 4<<30 {
		return cli.UsageErrorf("--target-size %q: 1MiB to 4GiB", o.target)
	}
	if o.minFiles < 2 || o.maxFiles < 2 {
		return cli.UsageErrorf("--min-files and --max-files: 2 or more")
	}
	ctx := cmd.Context()
	sy, closeAll, err := o.table.open(ctx, 1000)
	if err != nil {
		return err
	}
	defer closeAll()
	start := time.Now()
	res, err := sy.Compact(ctx, icebergsync.CompactConfig{TargetSize: target, MinFiles: o.minFiles, MaxFiles: o.maxFiles})
	if err != nil {
		return err
	}
	if o.json {
		b, _ := json.Marshal(res)
		fmt.Fprintln(cmd.OutOrStdout(), string(b))
	}
	if !o.quiet {
		fmt.Fprintf(cmd.ErrOrStderr(), "iceberg: %d files of %d versions merged into %d (%d rows, %d to %d bytes) in %.1fs",
			res.FilesRemoved, res.Partitions, res.FilesAdded, res.Rows, res.BytesRemoved, res.BytesAdded, time.Since(start).Seconds())
		if res.Conflicts > 0 {
			fmt.Fprintf(cmd.ErrOrStderr(), "; %d lost a race to a sync and were redone", res.Conflicts)
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "; snapshot %d\n", res.Snapshot)
	}
	return nil
}

func printSync(w io.Writer, sy *icebergsync.Syncer, res icebergsync.Result, took time.Duration) {
	fmt.Fprintf(w, "iceberg: %d shards (%d rows) added to %s in %d commits in %.1fs", res.Shards, res.Rows,
		strings.Join(sy.Table(), "."), res.Commits, took.Seconds())
	if res.Split > 0 {
		fmt.Fprintf(w, " (%d of several versions written one file per version)", res.Split)
	}
	if res.Conflicts > 0 {
		fmt.Fprintf(w, "; %d commits lost a race and were recomputed", res.Conflicts)
	}
	if res.Trajectories > 0 {
		fmt.Fprintf(w, "; %d trajectories added", res.Trajectories)
	}
	if res.DeadLetters > 0 {
		fmt.Fprintf(w, "; %d dead letters added", res.DeadLetters)
	}
	if res.DeadLetterBytesMissing > 0 {
		fmt.Fprintf(w, "; %d committed bytes of dead-letter files are gone (left out)", res.DeadLetterBytesMissing)
	}
	fmt.Fprintf(w, "; the table holds %d shards, snapshot %d\n", res.Position, res.Snapshot)
}

// writeReady writes text whole (a temporary file renamed), so that a
// reader never sees half of it.
func writeReady(path, text string) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, []byte(text+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
