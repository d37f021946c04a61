package iceberg

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/iceberg-go"
	"github.com/apache/iceberg-go/catalog"
	"github.com/apache/iceberg-go/table"
	"golang.org/x/sync/errgroup"

	"github.com/rllm-pipe/rllm-pipe/connectors/iceberg/syncresult"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Snapshot summary and table properties the projection keeps.
const (
	// PropShards is, in a snapshot's summary, how many of the manifest's
	// committed shards the table holds from that snapshot on.
	PropShards = "rllm-pipe.shards"
	// PropLastShard is the path (under the root) of the last of them.
	PropLastShard = "rllm-pipe.last-shard"
	// PropCommit names the commit attempt that made the snapshot, so that
	// a syncer whose commit's outcome it did not learn (an error after
	// the catalog may have taken it) tells its own from a rival's.
	PropCommit = "rllm-pipe.commit"
	// PropSource is, in the table's properties, the root it projects.
	PropSource = "rllm-pipe.source"
	// propRetries is Iceberg's commit retry count: 0 on our tables (see
	// the package doc).
	propRetries = "commit.retry.num-retries"
)

// maxConflicts bounds the commits one sync may lose to rivals before it
// gives up (the rivals are making progress; a later sync goes on).
const maxConflicts = 1000

// StepsTable is the name of the steps table in its namespace.
const StepsTable = "steps"

// Config says where the tables are and how the syncer works.
type Config struct {
	// Namespace holds the tables. Default {"rllm"}.
	Namespace []string
	// Base is the URL prefix of the root's files: file:///abs/root/ or
	// s3://bucket/prefix/ (a shard's data file is Base + its path).
	Base string
	// Location is the folder of the tables' locations (each table's
	// metadata, and the files the syncer writes, under Location/<table>):
	// default the catalog's warehouse's choice.
	Location string
	// MaxFilesPerCommit bounds the shards one commit adds (a long
	// backlog becomes several snapshots). Default 1000.
	MaxFilesPerCommit int
	// Concurrency bounds the footers read at once. Default GOMAXPROCS.
	Concurrency int
	// Properties are the tables' own properties when created (besides
	// ours).
	Properties iceberg.Properties
}

// Result is what a sync did (syncresult.Result: the executables that
// run a syncer read it without importing iceberg-go).
type Result = syncresult.Result

// Syncer adds a root's committed shards to the steps table.
type Syncer struct {
	cat catalog.Catalog
	r   store.Reader
	cfg Config
	id  table.Identifier
}

// NewSyncer returns a syncer of r's shards into cat.
func NewSyncer(cat catalog.Catalog, r store.Reader, cfg Config) (*Syncer, error) {
	if len(cfg.Namespace) == 0 {
		cfg.Namespace = []string{"rllm"}
	}
	if cfg.MaxFilesPerCommit <= 0 {
		cfg.MaxFilesPerCommit = 1000
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = runtime.GOMAXPROCS(0)
	}
	if !strings.HasSuffix(cfg.Base, "/") {
		return nil, fmt.Errorf("iceberg: base %q must end in /", cfg.Base)
	}
	return &Syncer{cat: cat, r: r, cfg: cfg, id: append(table.Identifier{}, append(cfg.Namespace, StepsTable)...)}, nil
}

// Table is the steps table's identifier.
func (s *Syncer) Table() table.Identifier { return s.id }

// crashPoint, set only by tests, runs before each step of the protocol.
var crashPoint func(name string)

func step(name string) {
	if crashPoint != nil {
		crashPoint(name)
	}
}

// Sync adds every committed shard the steps table does not hold yet, in
// commits of at most MaxFilesPerCommit shards, then the dead letters
// committed since the dead_letters table's position, and returns once
// both hold everything committed when they looked last.
func (s *Syncer) Sync(ctx context.Context) (Result, error) {
	res, err := s.syncSteps(ctx)
	if err != nil {
		return res, err
	}
	if res.Trajectories, err = s.SyncTrajectories(ctx); err != nil {
		return res, err
	}
	res.DeadLetters, res.DeadLetterBytesMissing, err = s.SyncDeadLetters(ctx)
	return res, err
}

func (s *Syncer) syncSteps(ctx context.Context) (Result, error) {
	var res Result
	inARow := 0
	for {
		step("load")
		tbl, err := s.open(ctx)
		if err != nil {
			return res, err
		}
		pos, err := Position(tbl)
		if err != nil {
			return res, err
		}
		if pos.Shards < res.Position {
			return res, fmt.Errorf("iceberg: table %s went back from %d shards to %d: another writer rewrote its history", s.id, res.Position, pos.Shards)
		}
		res.Position = pos.Shards
		if snap := tbl.CurrentSnapshot(); snap != nil {
			res.Snapshot = snap.SnapshotID
		}
		batch, err := s.nextShards(ctx, s.id, pos)
		if err != nil || len(batch) == 0 {
			return res, err
		}
		step("files")
		files, rows, split, err := s.dataFiles(ctx, tbl, batch)
		if err != nil {
			return res, err
		}
		next := Pos{Shards: pos.Shards + len(batch), LastShard: batch[len(batch)-1].Path}
		step("commit")
		committed, err := s.commitFiles(ctx, s.id, tbl, files, iceberg.Properties{PropShards: strconv.Itoa(next.Shards), PropLastShard: next.LastShard})
		if err != nil {
			return res, err
		}
		step("committed")
		if !committed {
			res.Conflicts++
			if inARow++; inARow > maxConflicts {
				return res, fmt.Errorf("iceberg: %d commits to %s lost a race in a row", inARow, s.id)
			}
			continue
		}
		inARow = 0
		res.Position = next.Shards
		res.Shards += len(batch)
		res.Rows += rows
		res.Split += split
		res.Commits++
	}
}

// nextShards returns the committed shards after pos, the position of the
// table id, at most MaxFilesPerCommit of them: what its next commit adds.
// The manifest must list pos.LastShard where pos says, or the table
// projects another root.
func (s *Syncer) nextShards(ctx context.Context, id table.Identifier, pos Pos) ([]schemas.ShardEntry, error) {
	entries, err := s.r.CommittedFrom(ctx, max(pos.Shards-1, 0))
	if err != nil {
		return nil, fmt.Errorf("iceberg: read the manifest: %w", err)
	}
	if pos.Shards > 0 {
		if len(entries) == 0 || entries[0].Path != pos.LastShard {
			return nil, fmt.Errorf("iceberg: table %s holds %d shards up to %q, which the manifest of %s does not list there: it projects another root (drop the table to rebuild it)",
				id, pos.Shards, pos.LastShard, s.r.Name())
		}
		entries = entries[1:]
	}
	return entries[:min(len(entries), s.cfg.MaxFilesPerCommit)], nil
}

// commitFiles adds files to the table id in one commit (commit).
func (s *Syncer) commitFiles(ctx context.Context, id table.Identifier, tbl *table.Table, files []iceberg.DataFile, props iceberg.Properties) (bool, error) {
	return s.commit(ctx, id, tbl, nil, files, props)
}

// commit adds files to the table id and removes the files remove, in one
// commit, with props (a position) and a fresh PropCommit in the
// snapshot's summary, requiring the table to be where tbl is. It reports
// false when the commit lost to another (the table moved: the caller
// reads the position again); an error whose outcome is unknown is
// resolved by reading the table back.
func (s *Syncer) commit(ctx context.Context, id table.Identifier, tbl *table.Table, remove, files []iceberg.DataFile, props iceberg.Properties) (bool, error) {
	txn := tbl.NewTransaction()
	nonce := newNonce()
	sum := iceberg.Properties{PropCommit: nonce}
	for k, v := range props {
		sum[k] = v
	}
	// The position in the table's properties too, in the same commit: it
	// outlives the snapshot once expired (positionProps).
	if err := txn.SetProperties(props); err != nil {
		return false, fmt.Errorf("iceberg: stage the position: %w", err)
	}
	if len(remove) > 0 {
		if err := txn.ReplaceDataFilesWithDataFiles(ctx, remove, files, sum); err != nil {
			return false, fmt.Errorf("iceberg: stage %d files replacing %d: %w", len(files), len(remove), err)
		}
	} else if err := txn.AddDataFiles(ctx, files, sum); err != nil {
		return false, fmt.Errorf("iceberg: stage %d files: %w", len(files), err)
	}
	_, err := txn.Commit(ctx)
	if err == nil {
		return true, nil
	}
	// Lost a race, or an outcome not known (a timeout after the catalog
	// took it): the table says which.
	back, lerr := s.cat.LoadTable(ctx, id)
	if lerr != nil {
		return false, fmt.Errorf("iceberg: commit: %w (and reading the table back: %v)", err, lerr)
	}
	for snap := back.CurrentSnapshot(); snap != nil && snap.SnapshotID != snapshotID(tbl); {
		if snap.Summary != nil && snap.Summary.Properties[PropCommit] == nonce {
			return true, nil // it landed
		}
		if snap.ParentSnapshotID == nil {
			break
		}
		snap = back.Metadata().SnapshotByID(*snap.ParentSnapshotID)
	}
	if snapshotID(back) != snapshotID(tbl) {
		return false, nil // another commit came first
	}
	return false, fmt.Errorf("iceberg: commit to %s: %w", id, err)
}

// newNonce is a commit attempt's name.
func newNonce() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func snapshotID(t *table.Table) int64 {
	if s := t.CurrentSnapshot(); s != nil {
		return s.SnapshotID
	}
	return 0
}

// dataFiles builds the Iceberg entries of batch's shards from their
// footers, concurrently; a shard of several versions becomes one file per
// version (splitShard).
func (s *Syncer) dataFiles(ctx context.Context, tbl *table.Table, batch []schemas.ShardEntry) ([]iceberg.DataFile, int64, int, error) {
	fs, err := tbl.FS(ctx)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("iceberg: table file IO: %w", err)
	}
	out := make([][]iceberg.DataFile, len(batch))
	splits := make([]bool, len(batch))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.cfg.Concurrency)
	for i, e := range batch {
		g.Go(func() error {
			if !store.CheckShardPath(e.Path) || strings.ContainsAny(e.Path, "%#?") {
				return fmt.Errorf("iceberg: shard path %q is not a clean relative path", e.Path)
			}
			p := s.cfg.Base + e.Path
			df, err := table.FileToDataFile(gctx, fs, p, tbl.Schema(), tbl.Spec(), 0, tbl.Properties())
			if err == nil {
				out[i] = []iceberg.DataFile{df}
				return nil
			}
			if !strings.Contains(err.Error(), "more than one value for partition field") {
				return fmt.Errorf("iceberg: shard %s: %w", e.Path, err)
			}
			files, err := s.splitShard(gctx, tbl, e)
			if err != nil {
				return fmt.Errorf("iceberg: shard %s of several versions: %w", e.Path, err)
			}
			out[i], splits[i] = files, true
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, 0, 0, err
	}
	var files []iceberg.DataFile
	var rows int64
	split := 0
	for i, fs := range out {
		files = append(files, fs...)
		for _, f := range fs {
			rows += f.Count()
		}
		if splits[i] {
			split++
		}
	}
	return files, rows, split, nil
}

// Pos is a table's position in the manifest.
type Pos struct {
	Shards    int
	LastShard string
}

// Position reads the steps table's position (positionProps).
func Position(tbl *table.Table) (Pos, error) {
	props, err := positionProps(tbl, PropShards)
	if err != nil || props == nil {
		return Pos{}, err
	}
	n, err := count(props, PropShards)
	if err != nil {
		return Pos{}, err
	}
	return Pos{Shards: n, LastShard: props[PropLastShard]}, nil
}

// positionOf reads the count under key of tbl's position (0: none).
func positionOf(tbl *table.Table, key string) (int, error) {
	props, err := positionProps(tbl, key)
	if err != nil || props == nil {
		return 0, err
	}
	return count(props, key)
}

func count(props map[string]string, key string) (int, error) {
	n, err := strconv.Atoi(props[key])
	if err != nil || n < 0 {
		return 0, fmt.Errorf("iceberg: %s = %q is not a count", key, props[key])
	}
	return n, nil
}

// positionProps returns where tbl's position under key is recorded: the
// summary of the newest snapshot of its lineage that has key (snapshots
// others committed, such as a rewrite, have none); where the lineage is
// cut before one (the snapshots ours made have expired), the table's
// properties, which each of our commits sets with its snapshot. nil: a
// table no commit of ours reached. A lineage that ends, complete, at a
// snapshot of another writer while the properties say ours committed was
// replaced (CREATE OR REPLACE): refused, as syncing on would add shards
// the replacement may hold.
func positionProps(tbl *table.Table, key string) (map[string]string, error) {
	meta := tbl.Metadata()
	_, ours := tbl.Properties()[key]
	for snap := tbl.CurrentSnapshot(); snap != nil; {
		if snap.Summary != nil {
			if _, ok := snap.Summary.Properties[key]; ok {
				return snap.Summary.Properties, nil
			}
		}
		if snap.ParentSnapshotID == nil {
			if ours {
				return nil, fmt.Errorf("iceberg: table %s: its history was replaced by another writer after rllm-pipe synced it: drop it and sync again", tbl.Identifier())
			}
			return nil, nil
		}
		parent := meta.SnapshotByID(*snap.ParentSnapshotID)
		if parent == nil {
			if ours {
				return tbl.Properties(), nil
			}
			return nil, fmt.Errorf("iceberg: table %s: snapshot %d's parent %d has expired before any snapshot recorded the position: drop it and sync again", tbl.Identifier(), snap.SnapshotID, *snap.ParentSnapshotID)
		}
		snap = parent
	}
	return nil, nil
}

// open loads the steps table (openTable).
func (s *Syncer) open(ctx context.Context) (*table.Table, error) {
	return s.openTable(ctx, s.id, schemas.StepSchema, []string{"group_version"})
}

// openTable loads the table id, creating its namespace and itself when
// absent (partitioned by identity on the columns partition), and brings
// it to what the syncer needs: our retry setting, the root it projects,
// and every column of sc.
func (s *Syncer) openTable(ctx context.Context, id table.Identifier, sc *arrow.Schema, partition []string) (*table.Table, error) {
	want, err := tableSchema(sc)
	if err != nil {
		return nil, err
	}
	tbl, err := s.cat.LoadTable(ctx, id)
	if errors.Is(err, catalog.ErrNoSuchTable) {
		tbl, err = s.create(ctx, id, want, partition)
	}
	if err != nil {
		return nil, fmt.Errorf("iceberg: table %s: %w", id, err)
	}
	props := tbl.Properties()
	if src := props[PropSource]; src != "" && src != s.r.Name() {
		return nil, fmt.Errorf("iceberg: table %s projects %s, not %s", id, src, s.r.Name())
	}
	missing := false
	for _, f := range want.Fields() {
		if _, ok := tbl.Schema().FindFieldByName(f.Name); !ok {
			missing = true
		}
	}
	if props[propRetries] == "0" && props[PropSource] != "" && !missing {
		return tbl, nil
	}
	// Schema evolution (our schema gained columns) and our settings, in
	// one commit; idempotent, so a race or a crash only repeats it.
	txn := tbl.NewTransaction()
	if missing {
		if err := txn.UpdateSchema(true, false).UnionByNameWith(want).Commit(); err != nil {
			return nil, fmt.Errorf("iceberg: evolve %s's schema: %w", id, err)
		}
	}
	if err := txn.SetProperties(iceberg.Properties{propRetries: "0", PropSource: s.r.Name()}); err != nil {
		return nil, err
	}
	if _, err := txn.Commit(ctx); err != nil {
		// Another syncer may have done the same: read it back.
		if back, lerr := s.cat.LoadTable(ctx, id); lerr == nil && back.Properties()[propRetries] == "0" {
			return back, nil
		}
		return nil, fmt.Errorf("iceberg: set up %s: %w", id, err)
	}
	return s.cat.LoadTable(ctx, id)
}

func (s *Syncer) create(ctx context.Context, id table.Identifier, sc *iceberg.Schema, partition []string) (*table.Table, error) {
	ns := table.Identifier(s.cfg.Namespace)
	if err := s.cat.CreateNamespace(ctx, ns, nil); err != nil && !errors.Is(err, catalog.ErrNamespaceAlreadyExists) {
		// A catalog that checks, then inserts, may fail the loser of a
		// race to create it otherwise (Iceberg's REST fixture answers
		// 500): the namespace is there all the same.
		if ok, cerr := s.cat.CheckNamespaceExists(ctx, ns); cerr != nil || !ok {
			return nil, fmt.Errorf("create namespace %s: %w", strings.Join(ns, "."), err)
		}
	}
	var popts []iceberg.PartitionOption
	for _, col := range partition {
		popts = append(popts, iceberg.AddPartitionFieldByName(col, col, iceberg.IdentityTransform{}, sc, nil))
	}
	spec, err := iceberg.NewPartitionSpecOpts(popts...)
	if err != nil {
		return nil, fmt.Errorf("partition spec: %w", err)
	}
	props := iceberg.Properties{
		propRetries: "0", PropSource: s.r.Name(),
		"format-version": "2", "write.parquet.compression-codec": "zstd",
	}
	for k, v := range s.cfg.Properties {
		props[k] = v
	}
	opts := []catalog.CreateTableOpt{catalog.WithPartitionSpec(&spec), catalog.WithProperties(props)}
	if s.cfg.Location != "" {
		opts = append(opts, catalog.WithLocation(strings.TrimSuffix(s.cfg.Location, "/")+"/"+id[len(id)-1]))
	}
	step("create")
	tbl, err := s.cat.CreateTable(ctx, id, sc, opts...)
	if errors.Is(err, catalog.ErrTableAlreadyExists) {
		return s.cat.LoadTable(ctx, id)
	}
	return tbl, err
}

// TableSchema is the steps table's schema: the shards'
// (schemas.StepSchema) with every field optional, so that shards of
// earlier schema versions, which lack later columns, read as nulls there.
func TableSchema() (*iceberg.Schema, error) { return tableSchema(schemas.StepSchema) }

func tableSchema(sc *arrow.Schema) (*iceberg.Schema, error) {
	fields := make([]arrow.Field, len(sc.Fields()))
	for i, f := range sc.Fields() {
		f.Nullable = true
		fields[i] = f
	}
	out, err := table.ArrowSchemaToIcebergWithFreshIDs(arrow.NewSchema(fields, nil), false)
	if err != nil {
		return nil, fmt.Errorf("iceberg: table schema: %w", err)
	}
	return out, nil
}

// splitName is where a version's rows of a shard of several versions go,
// under the table's data folder: named after the shard and the attempt.
func splitName(shard string, version int64, attempt string) string {
	base := strings.TrimSuffix(path.Base(shard), ".parquet")
	return fmt.Sprintf("group_version=%d/%s-v%d-%s.parquet", version, base, version, attempt)
}

// splitShard writes the rows of a shard of several versions again, one
// file per version under the table's data folder, in their order (a
// trajectory's rows keep their prompt deltas: a trajectory has one
// version), and returns their entries.
func (s *Syncer) splitShard(ctx context.Context, tbl *table.Table, e schemas.ShardEntry) ([]iceberg.DataFile, error) {
	mem := memory.NewGoAllocator()
	rd, err := s.r.ReadShard(ctx, e, nil, mem)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	rd.KeepDeltas()
	attempt := strconv.FormatInt(time.Now().UnixNano(), 36)
	outs := map[int64]*tableFile{}
	var order []int64
	abortAll := func() {
		for _, o := range outs {
			o.abort()
		}
	}
	err = rd.Each(func(rec arrow.RecordBatch) error {
		idx := rec.Schema().FieldIndices("group_version")
		if len(idx) == 0 {
			return fmt.Errorf("no group_version column")
		}
		col, ok := rec.Column(idx[0]).(*array.Int64)
		if !ok {
			return fmt.Errorf("group_version is %s, not int64", rec.Column(idx[0]).DataType())
		}
		for lo := 0; lo < int(rec.NumRows()); {
			v := col.Value(lo)
			hi := lo + 1
			for hi < int(rec.NumRows()) && col.Value(hi) == v {
				hi++
			}
			o := outs[v]
			if o == nil {
				var err error
				if o, err = createFile(ctx, tbl, splitName(e.Path, v, attempt), rec.Schema(),
					map[string]string{schemas.FooterSchemaKey: e.SchemaVersion}, mem); err != nil {
					return err
				}
				outs[v] = o
				order = append(order, v)
			}
			part := rec.NewSlice(int64(lo), int64(hi))
			err := o.write(part)
			part.Release()
			if err != nil {
				return err
			}
			lo = hi
		}
		return nil
	})
	if err != nil {
		abortAll()
		return nil, err
	}
	var files []iceberg.DataFile
	for _, v := range order {
		df, err := outs[v].finish(ctx)
		if err != nil {
			abortAll()
			return nil, err
		}
		files = append(files, df)
	}
	return files, nil
}
