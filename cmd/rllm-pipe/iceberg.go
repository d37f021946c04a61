//go:build !noiceberg

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/apache/iceberg-go"
	"github.com/spf13/cobra"

	"github.com/rllm-pipe/rllm-pipe/connectors"
	icebergsync "github.com/rllm-pipe/rllm-pipe/connectors/iceberg"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
)

type icebergOpts struct {
	from        string
	catalog     string
	catalogName string
	namespace   string
	warehouse   string
	maxFiles    int
	follow      bool
	poll        time.Duration
	json        bool
	quiet       bool
	conn        connFlags
}

func newIcebergCmd(soft context.Context) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "iceberg",
		Short: "Project committed shards into Apache Iceberg tables (Spark, Trino, pyiceberg read them)",
	}
	var o icebergOpts
	syncCmd := &cobra.Command{
		Use:   "sync --from URL --catalog URI",
		Short: "Add every committed shard not yet in the Iceberg steps table, exactly once (no rewrite)",
		Long: `sync adds the root's committed shards to the Iceberg table NAMESPACE.steps as
they are (no rewrite: Iceberg takes its column statistics from their footers),
partitioned by group_version. Each snapshot records how many of the
manifest's shards the table holds, so a re-run, a second syncer or a crash
adds nothing twice and skips nothing. With --follow it keeps the table in step
with a running ingest until stopped (SIGINT, SIGTERM).

--catalog names the catalog: a SQLite file (sqlite:///path/catalog.db, or a
path ending in .db: created with its tables if absent, no service) or a REST
catalog (http://host:port, token from ICEBERG_REST_TOKEN). Readers use the
same catalog name (--catalog-name) and the table's location.

Example:
  rllm-pipe iceberg sync --from ./data --catalog ./lake/catalog.db
  python -c 'from pyiceberg.catalog.sql import SqlCatalog; print(SqlCatalog("rllm", uri="sqlite:///lake/catalog.db").load_table("rllm.steps").scan().to_arrow().num_rows)'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runIcebergSync(soft, cmd, o)
		},
	}
	f := syncCmd.Flags()
	f.StringVar(&o.from, "from", "", "shard root: file:///path, a path, or s3://bucket/prefix")
	f.StringVar(&o.catalog, "catalog", "", "Iceberg catalog: a SQLite file (sqlite:///path.db, path.db) or a REST catalog (http(s)://...)")
	f.StringVar(&o.catalogName, "catalog-name", icebergsync.DefaultCatalogName, "the catalog's name, as readers configure it")
	f.StringVar(&o.namespace, "namespace", "rllm", "namespace of the tables (dots separate levels)")
	f.StringVar(&o.warehouse, "warehouse", "", "where new tables keep their metadata (default: the root's _iceberg folder)")
	f.IntVar(&o.maxFiles, "max-files-per-commit", 1000, "most shards one snapshot adds")
	f.BoolVar(&o.follow, "follow", false, "keep syncing new commits until stopped")
	f.DurationVar(&o.poll, "poll", 2*time.Second, "with --follow, how often to look for new commits")
	f.BoolVar(&o.json, "json", false, "print each sync's result as a JSON line on stdout")
	f.BoolVar(&o.quiet, "quiet", false, "no summary on stderr")
	o.conn.register(f)
	cmd.AddCommand(syncCmd)
	return cmd
}

func runIcebergSync(soft context.Context, cmd *cobra.Command, o icebergOpts) error {
	if o.catalog == "" {
		return usageErrorf("--catalog is required")
	}
	if o.maxFiles < 1 || o.maxFiles > 100000 {
		return usageErrorf("--max-files-per-commit %d: 1 to 100000", o.maxFiles)
	}
	if o.poll <= 0 {
		return usageErrorf("--poll %s: positive", o.poll)
	}
	if err := o.conn.check(); err != nil {
		return err
	}
	root, err := connectors.ParseRoot(o.from, o.conn.options())
	if err != nil {
		return usageErrorf("--from: %v", err)
	}
	ctx := cmd.Context()
	r, err := connectors.OpenReader(ctx, root, "iceberg-"+newRunID())
	if err != nil {
		return err
	}
	defer r.Close()
	sy, closeCat, err := openIceberg(ctx, root, r, icebergTarget{catalog: o.catalog, name: o.catalogName, namespace: o.namespace,
		warehouse: o.warehouse, maxFiles: o.maxFiles})
	if err != nil {
		return err
	}
	defer closeCat()
	for {
		start := time.Now()
		res, err := sy.Sync(ctx)
		if err != nil {
			if !o.follow || ctx.Err() != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "iceberg: %v; again in %s\n", err, o.poll)
		} else {
			if o.json {
				b, _ := json.Marshal(res)
				fmt.Fprintln(cmd.OutOrStdout(), string(b))
			}
			if !o.quiet && (!o.follow || res.Shards > 0) {
				printIcebergSync(cmd.ErrOrStderr(), sy, res, time.Since(start))
			}
		}
		if !o.follow {
			return nil
		}
		select {
		case <-soft.Done():
			return nil
		case <-ctx.Done():
			return nil
		case <-time.After(o.poll):
		}
	}
}

// openIceberg opens the catalog and a syncer of r's shards (root's) into
// it; the function returned closes the catalog.
func openIceberg(ctx context.Context, root connectors.Root, r store.Reader, t icebergTarget) (*icebergsync.Syncer, func() error, error) {
	ns := strings.Split(t.namespace, ".")
	for _, part := range ns {
		if part == "" {
			return nil, nil, usageErrorf("namespace %q: empty level", t.namespace)
		}
	}
	base, warehouse, props, err := icebergLocations(root, t.warehouse)
	if err != nil {
		return nil, nil, usageErrorf("%v", err)
	}
	catProps := iceberg.Properties{}
	for k, v := range props {
		catProps[k] = v
	}
	location := ""
	rest := strings.HasPrefix(t.catalog, "http://") || strings.HasPrefix(t.catalog, "https://")
	if !rest || t.warehouse != "" {
		// A REST catalog places tables in its own warehouse unless told.
		catProps["warehouse"] = warehouse
		location = strings.TrimSuffix(warehouse, "/") + "/" + strings.Join(ns, ".")
	}
	cat, err := icebergsync.OpenCatalog(ctx, t.catalog, t.name, catProps)
	if errors.Is(err, icebergsync.ErrCatalogURI) {
		return nil, nil, usageErrorf("%v", err)
	}
	if err != nil {
		return nil, nil, err
	}
	sy, err := icebergsync.NewSyncer(cat, r, icebergsync.Config{Namespace: ns, Base: base, MaxFilesPerCommit: t.maxFiles, Location: location})
	if err != nil {
		return nil, nil, errors.Join(err, cat.Close())
	}
	return sy, cat.Close, nil
}

func printIcebergSync(w io.Writer, sy *icebergsync.Syncer, res icebergsync.Result, took time.Duration) {
	fmt.Fprintf(w, "iceberg: %d shards (%d rows) added to %s in %d commits in %.1fs", res.Shards, res.Rows,
		strings.Join(sy.Table(), "."), res.Commits, took.Seconds())
	if res.Split > 0 {
		fmt.Fprintf(w, " (%d of several versions written one file per version)", res.Split)
	}
	if res.Conflicts > 0 {
		fmt.Fprintf(w, "; %d commits lost a race and were recomputed", res.Conflicts)
	}
	fmt.Fprintf(w, "; the table holds %d shards, snapshot %d\n", res.Position, res.Snapshot)
}

// icebergLocations returns the URL prefix of the root's files, the
// warehouse (the root's _iceberg folder by default) and the file IO
// properties for S3 (credentials from the environment, as the store's).
func icebergLocations(root connectors.Root, warehouse string) (base, wh string, props map[string]string, err error) {
	if root.S3 == nil {
		abs, err := filepath.Abs(root.Path)
		if err != nil {
			return "", "", nil, err
		}
		base = "file://" + filepath.ToSlash(abs) + "/"
		if warehouse == "" {
			warehouse = base + "_iceberg"
		} else if !strings.Contains(warehouse, "://") {
			w, err := filepath.Abs(warehouse)
			if err != nil {
				return "", "", nil, err
			}
			warehouse = "file://" + filepath.ToSlash(w)
		}
		return base, warehouse, nil, nil
	}
	c := root.S3
	base = "s3://" + c.Bucket + "/"
	if c.Prefix != "" {
		base += c.Prefix + "/"
	}
	if warehouse == "" {
		warehouse = base + "_iceberg"
	}
	props = map[string]string{"s3.endpoint": c.Endpoint, "s3.region": c.Region, "s3.access-key-id": c.AccessKey,
		"s3.secret-access-key": c.SecretKey, "s3.force-virtual-addressing": "false"}
	return base, warehouse, props, nil
}

// finishTimeout bounds ingest's last sync.
const finishTimeout = 2 * time.Minute

func init() {
	startIcebergFunc = func(ctx context.Context, root connectors.Root, r store.Reader, t icebergTarget, every time.Duration, log *slog.Logger) (icebergRun, error) {
		t.name, t.maxFiles = icebergsync.DefaultCatalogName, 1000
		sy, closeCat, err := openIceberg(ctx, root, r, t)
		if err != nil {
			return nil, err
		}
		f := icebergsync.Follow(ctx, sy, every, func(err error) {
			log.Warn("iceberg: sync failed; retried at the next interval", "err", err)
		})
		return &closingFollower{f: f, close: closeCat}, nil
	}
}

// closingFollower is an icebergRun: the follower, and the catalog closed
// once it has stopped.
type closingFollower struct {
	f     *icebergsync.Follower
	close func() error
	done  sync.Once
}

func (c *closingFollower) halt() {
	c.f.Halt()
	c.done.Do(func() { _ = c.close() })
}

func (c *closingFollower) finish(ctx context.Context) (icebergTotals, error) {
	res, err := c.f.Finish(ctx, finishTimeout)
	c.done.Do(func() { _ = c.close() })
	return icebergTotals(res), err
}
