// Package s3 is the object-store output: shards, dead letters and the
// manifest in S3 or MinIO (minio-go is imported here only).
//
// # Protocol
//
// The object store is the source of truth. The manifest is a log of
// numbered objects, <prefix>/_manifest/<seq>.json, each one
// schemas.ShardEntry, or several appended at once through one Store
// (group commit, group.go). An entry is appended by a create-only PUT
// (If-None-Match: *) of the next number: of two writers racing for a
// number exactly one wins; the other re-reads the log and tries the next.
// The log is therefore linear, and every writer that appends has first
// read everything before its entry.
//
// A writer claims input streams (a file, a Kafka partition) by appending an
// entry with Claims and its Kafka generation. A commit that settles
// positions of a stream whose latest claim is another writer's is refused
// (ErrFenced): a zombie that lost its partition cannot commit, because to
// append it must read the claim that fenced it. A claim from an older
// generation than the stream's latest is refused too, so a slow worker
// cannot take a partition back after a rebalance moved it on.
//
// A PUT whose answer was lost may have landed: minio-go's own retries are
// off, and after every re-read of the log an append looks for its nonce
// before trying again, so an entry is never appended twice.
//
// A shard is uploaded create-only under its final key, then its entry is
// appended. What is durable when:
//   - shard uploaded, entry not appended (crash, fenced, cut short): an
//     orphan, invisible to readers of the manifest, deleted by the writer
//     itself when its generation ends (RemoveOwnOrphans, which lists only
//     its own names in the partitions it wrote to) or by the next writer
//     that claims once its writer holds no claim (RemoveOrphans, which
//     lists objects before re-reading the log, so an object committed
//     meanwhile counts as listed, and lists only when there is a writer
//     it has not cleaned up after since that one's latest entry); a
//     writer that claims no input stream claims one of its own
//     (store.WriterStream), so it holds a claim while it runs; a shard is
//     deleted at once only when its append was fenced, the one failure
//     known not to have landed;
//   - entry appended: the shard is committed, and the positions it settles
//     are skipped by every later run (the resume point of a stream is its
//     first unsettled position);
//   - dead letters are uploaded as an object referenced by the entry that
//     settles their records, so they too are committed exactly once.
//
// The log is a store.Journal: every SnapshotEvery records a snapshot of
// the replayed log (snap-<seq>.json) is written, readers and writers open
// from the newest one, and the entries before the second newest are
// deleted; a writer that slept through that sees it and reloads. A
// snapshot holds the listed entries after its sealed segments
// (seg-<first>-<count>.json, SegmentSize entries each, written once and
// never deleted) and names those, so it stays small however long the run.
//
// Readers list committed shards from the log (Committed); at a quiet
// point, when no writer is mid-commit, the shard objects are exactly
// those.
package s3

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// ErrFenced is returned when another writer has claimed a stream this
// writer tried to settle.
var ErrFenced = store.ErrFenced

// errExists is a create-only PUT that lost.
var errExists = errors.New("s3: object exists")

// Config locates the bucket. Credentials come from the standard AWS
// variables or flags; they are never logged.
type Config struct {
	Endpoint  string // http(s)://host:port
	AccessKey string
	SecretKey string
	Region    string
	Bucket    string
	Prefix    string // no leading or trailing slash
	// SnapshotEvery is how many manifest records separate two snapshots
	// (0: SnapshotEvery; a group commit's record holds several entries).
	SnapshotEvery int
	// SegmentSize is how many shard and dead-letter entries a sealed
	// segment of the snapshots holds (0: SegmentSize).
	SegmentSize int
	// RetryFor bounds how long one operation is retried through an
	// outage before it fails (0: DefaultRetryFor).
	RetryFor time.Duration
	// Linger is how long the append that makes a record waits for more
	// appends through the same Store to join it (group commit; 0: none,
	// a record takes what is queued when it starts).
	Linger time.Duration
	// Transport carries the client's HTTP requests (nil: minio-go's
	// default), e.g. through a proxy; a test can stop the process at a
	// chosen request with it.
	Transport http.RoundTripper
}

// DefaultRetryFor is how long an operation is retried through an outage
// by default: long enough for a store to restart, short enough that a
// run whose store is gone fails with the reason.
const DefaultRetryFor = 15 * time.Minute

// SnapshotEvery is how many manifest entries separate two snapshots of
// the log: an opening reader reads the newest snapshot and fewer entries
// than this after it, and the entries before the second newest snapshot
// are deleted (store.Journal).
const SnapshotEvery = 256

// SegmentSize is how many listed entries (shards, dead-letter files) a
// sealed segment of the manifest's snapshots holds: a snapshot names the
// segments, immutable objects _manifest/seg-<first>-<count>.json, and
// holds only the entries after them, so writing one costs the same
// however long the run (store.Log.Snapshot). 4,096 entries are ~1.5 MB of
// JSON with a group key a shard; a million shards make ~250 segments.
const SegmentSize = 4096

// String describes the location without secrets.
func (c Config) String() string {
	return fmt.Sprintf("s3://%s/%s at %s", c.Bucket, c.Prefix, shownURL(c.Endpoint))
}

// shownURL is u for messages: without a user or password it holds (an
// endpoint's credentials belong in the environment, and a message is
// logged), and not repeated at all when it does not parse.
func shownURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(a URL that does not parse)"
	}
	p.User = nil
	return p.String()
}

// ParseURL reads s3://bucket/prefix and fills the rest from the
// environment: AWS_ENDPOINT_URL (or RLLM_PIPE_S3_ENDPOINT), AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, AWS_REGION (default us-east-1).
func ParseURL(raw string) (Config, error) {
	u, err := url.Parse(raw)
	if err == nil && u.User != nil {
		return Config{}, errors.New("s3: the URL holds a user or password: give the keys in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or the AWS config) instead")
	}
	if err != nil || u.Scheme != "s3" || u.Host == "" {
		return Config{}, fmt.Errorf("s3: %s is not s3://bucket/prefix", shownURL(raw))
	}
	c := Config{
		Bucket:    u.Host,
		Prefix:    strings.Trim(u.Path, "/"),
		Endpoint:  firstEnv("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "RLLM_PIPE_S3_ENDPOINT"),
		AccessKey: os.Getenv("AWS_ACCESS_KEY_ID"),
		SecretKey: os.Getenv("AWS_SECRET_ACCESS_KEY"),
		Region:    firstEnv("AWS_REGION", "AWS_DEFAULT_REGION"),
	}
	if c.Region == "" {
		c.Region = "us-east-1"
	}
	if c.Endpoint == "" {
		c.Endpoint = "https://s3." + c.Region + ".amazonaws.com"
	}
	return c, nil
}

func firstEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

// Store is a manifest log and the objects it lists. Safe for concurrent
// use.
type Store struct {
	cli    *minio.Client
	cfg    Config
	writer string

	journal   *store.Journal // the manifest: _manifest/<seq>.json, snapshots snap-<seq>.json
	manifest  *Objects       // the manifest's folder (the journal's, and the sealed segments)
	snapEvery int64
	segSize   int

	mu   sync.Mutex
	log  *store.Log
	next int64 // the next sequence number to try
	// cleaned holds the writers whose orphans RemoveOrphans removed, with
	// the log's next entry then: a writer that appended nothing since is
	// not looked for again (forgotten when the log is reloaded).
	cleaned map[string]int64
	// touched holds the partition folders this writer created shards in
	// since its last sweep: where its own orphans can be.
	touched map[string]bool
	dlqSeq  atomic.Int64 // numbers this writer's dead-letter objects
	dl      *DeadLetters

	// queue holds the appends waiting for a record (group.go).
	queue store.Queue[schemas.ShardEntry]
}

var _ store.Store = (*Store)(nil)

// Open connects, creates the bucket if needed, and reads the manifest log
// (orphans are removed by RemoveOrphans, not here). writer names this run
// in entries and object keys; it must be unique per run.
func Open(ctx context.Context, cfg Config, writer string) (*Store, error) {
	return openStore(ctx, cfg, writer, true)
}

// OpenReader connects to an existing bucket and reads the manifest log,
// for readers of committed shards: a missing bucket is an error (a typo
// must not create an empty bucket that reads as no data).
func OpenReader(ctx context.Context, cfg Config, name string) (*Store, error) {
	return openStore(ctx, cfg, name, false)
}

func openStore(ctx context.Context, cfg Config, writer string, create bool) (*Store, error) {
	ep, err := url.Parse(cfg.Endpoint)
	if err != nil || ep.Host == "" {
		return nil, fmt.Errorf("s3: endpoint %s is not a URL", shownURL(cfg.Endpoint))
	}
	if ep.User != nil {
		return nil, fmt.Errorf("s3: endpoint %s holds a user or password: give the keys in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or the AWS config) instead", shownURL(cfg.Endpoint))
	}
	var creds *credentials.Credentials
	if cfg.AccessKey != "" {
		creds = credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, "")
	} else {
		creds = credentials.NewChainCredentials([]credentials.Provider{&credentials.EnvAWS{}, &credentials.FileAWSCredentials{}, &credentials.IAM{}})
	}
	// MaxRetries 1: retries happen in retry(), which knows that a PUT
	// refused on a second attempt may be our own first one.
	// TrailingHeaders: an upload carries a CRC32C of its body in a trailer
	// (see putIfAbsent).
	cli, err := minio.New(ep.Host, &minio.Options{Creds: creds, Secure: ep.Scheme == "https", Region: cfg.Region, BucketLookup: minio.BucketLookupPath, MaxRetries: 1,
		TrailingHeaders: true, Transport: cfg.Transport})
	if err != nil {
		return nil, fmt.Errorf("s3: client for %s: %w", cfg, err)
	}
	s := &Store{cli: cli, cfg: cfg, writer: writer, log: store.NewLog(), snapEvery: int64(cfg.SnapshotEvery),
		cleaned: map[string]int64{}, touched: map[string]bool{}}
	s.queue.Linger = cfg.Linger
	if s.snapEvery <= 0 {
		s.snapEvery = SnapshotEvery
	}
	s.segSize = cfg.SegmentSize
	if s.segSize <= 0 {
		s.segSize = SegmentSize
	}
	s.manifest = &Objects{s: s, dir: store.ManifestDir}
	s.journal = store.NewJournal(s.manifest)
	var ok bool
	if err := cfg.retry(ctx, func(int) (err error) { ok, err = cli.BucketExists(ctx, cfg.Bucket); return err }); err != nil {
		return nil, fmt.Errorf("s3: bucket %s: %w", cfg.Bucket, err)
	}
	if !ok && !create {
		return nil, fmt.Errorf("s3: bucket %s does not exist at %s", cfg.Bucket, shownURL(cfg.Endpoint))
	}
	if !ok {
		if err := cli.MakeBucket(ctx, cfg.Bucket, minio.MakeBucketOptions{Region: cfg.Region}); err != nil {
			if ok2, _ := cli.BucketExists(ctx, cfg.Bucket); !ok2 {
				return nil, fmt.Errorf("s3: create bucket %s: %w", cfg.Bucket, err)
			}
		}
	}
	if err := s.load(ctx); err != nil {
		return nil, err
	}
	if err := s.refresh(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Store) key(rel string) string {
	if s.cfg.Prefix == "" {
		return rel
	}
	return s.cfg.Prefix + "/" + rel
}

// refresh reads the log entries from s.next on; a store that fell behind
// a compaction reloads from the newest snapshot. Callers hold no lock.
func (s *Store) refresh(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		data, behind, err := s.journal.Next(ctx, s.next)
		if err != nil {
			return fmt.Errorf("s3: read manifest entry %d: %w", s.next, err)
		}
		if behind {
			if err := s.reload(ctx); err != nil {
				return err
			}
			continue
		}
		if data == nil {
			return nil
		}
		entries, err := decodeRecord(data)
		if err != nil {
			return fmt.Errorf("s3: manifest entry %d: %w", s.next, err)
		}
		s.applyRecord(entries)
	}
}

// reload replaces the log with the newest snapshot, which must be ahead of
// it. Callers hold mu.
func (s *Store) reload(ctx context.Context) error {
	data, _, ok, err := s.journal.Latest(ctx)
	if err != nil {
		return fmt.Errorf("s3: manifest: %w", err)
	}
	if !ok {
		return fmt.Errorf("s3: manifest entry %d is missing and no snapshot covers it", s.next)
	}
	l, next, err := s.restore(data)
	if err != nil {
		return err
	}
	if next <= s.next {
		return fmt.Errorf("s3: manifest entry %d is missing below the newest snapshot (before %d)", s.next, next)
	}
	s.log, s.next = l, next
	clear(s.cleaned) // the entries skipped may show activity
	return nil
}

// restore decodes a snapshot without reading its sealed segments: a call
// that needs them reads them (loaded: every one; Log.LoadFrom: those
// holding the shards a follower asks for), so that a writer's open, and a
// consumer's that starts late in the log, stay flat in its length.
func (s *Store) restore(data []byte) (*store.Log, int64, error) {
	return store.RestoreHead(data, s.manifest.Get)
}

// loaded reads the sealed segments not read yet, for the calls that need
// every entry. Callers hold mu.
func (s *Store) loaded(ctx context.Context) error {
	if s.log.Loaded() {
		return nil
	}
	if err := s.log.Load(ctx); err != nil {
		return fmt.Errorf("s3: manifest: %w", err)
	}
	return nil
}

// load starts from the newest snapshot, if any. Callers hold no lock.
func (s *Store) load(ctx context.Context) error {
	data, _, ok, err := s.journal.Latest(ctx)
	if err != nil || !ok {
		return err
	}
	l, next, err := s.restore(data)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if next > s.next {
		s.log, s.next = l, next
	}
	return nil
}

// get reads the object at key, retrying transient failures; missing
// reports that there is none.
func (s *Store) get(ctx context.Context, key string) (data []byte, missing bool, err error) {
	err = s.cfg.retry(ctx, func(int) error {
		obj, err := s.cli.GetObject(ctx, s.cfg.Bucket, key, minio.GetObjectOptions{})
		if err != nil {
			return err
		}
		defer obj.Close()
		data, err = io.ReadAll(obj)
		if err != nil && minio.ToErrorResponse(err).Code == "NoSuchKey" {
			missing = true
			return nil
		}
		return err
	})
	return data, missing, err
}

// transient reports errors worth retrying: the network, throttling and
// server errors. A lost precondition, a missing key or a refused
// credential is final.
func transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ne net.Error
	var ue *url.Error
	if errors.As(err, &ne) || errors.As(err, &ue) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) {
		return true // no HTTP answer: connection refused, reset, timeout
	}
	var r minio.ErrorResponse
	if !errors.As(err, &r) {
		return false
	}
	switch {
	case r.StatusCode >= 500, r.StatusCode == http.StatusTooManyRequests, r.StatusCode == http.StatusRequestTimeout:
		return true
	}
	return false
}

// Retries counts operations retried after a transient error.
var Retries atomicCounter

// ErrGaveUp is an operation abandoned while a transient failure lasted:
// after Config.RetryFor, or on a soft stop (store.WithRetryStop).
var ErrGaveUp = errors.New("s3: gave up retrying")

// retry runs op until it succeeds, fails for good, or ctx ends, backing
// off from 100 ms to 5 s between attempts: an object-store outage pauses
// the pipeline instead of failing it, for at most RetryFor, and no longer
// than a soft stop. attempt is 0 on the first call.
func (c Config) retry(ctx context.Context, op func(attempt int) error) error {
	limit := c.RetryFor
	if limit <= 0 {
		limit = DefaultRetryFor
	}
	delay := 100 * time.Millisecond
	var giveUp <-chan time.Time
	for attempt := 0; ; attempt++ {
		err := op(attempt)
		if !transient(err) {
			return err
		}
		if giveUp == nil {
			t := time.NewTimer(limit)
			defer t.Stop()
			giveUp = t.C
		}
		Retries.Add(1)
		slog.Warn("s3: transient failure, retrying", "attempt", attempt+1, "in", delay, "err", err)
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-store.RetryStop(ctx):
			return fmt.Errorf("%w: stopping while %s is unreachable (%d attempts): %w", ErrGaveUp, shownURL(c.Endpoint), attempt+1, err)
		case <-giveUp:
			return fmt.Errorf("%w: %s unreachable for %s (%d attempts; --retry-for): %w", ErrGaveUp, shownURL(c.Endpoint), limit, attempt+1, err)
		case <-time.After(delay):
		}
		delay = min(delay*2, 5*time.Second)
	}
}

// putIfAbsent uploads body under key unless an object exists there. It
// retries transient failures; ours reports whether an object found at the
// key on a retry may be our own earlier attempt (whose answer was lost).
func (s *Store) putIfAbsent(ctx context.Context, key string, body io.ReadSeeker, size int64, contentType string) error {
	return s.cfg.retry(ctx, func(attempt int) error {
		if _, err := body.Seek(0, io.SeekStart); err != nil {
			return err
		}
		// One PUT: the If-None-Match precondition is not honoured across a
		// multipart upload (TestIntegrationLargeObjectCreateOnly), and a single
		// PUT takes up to 5 GiB, far above the shard size. The body is not
		// hashed with SHA-256 for the signature (over plain HTTP minio-go
		// would sign every 64 KiB chunk, and the server check each): a
		// CRC32C of the whole body, sent in a trailer and checked by the
		// server, guards it instead, at a fraction of the CPU on both sides.
		// (Checksum is set explicitly: minio-go v7.4.1 drops its default
		// CRC trailer on a single PUT.)
		opts := minio.PutObjectOptions{ContentType: contentType, DisableMultipart: true, DisableContentSha256: true, Checksum: minio.ChecksumCRC32C}
		opts.SetMatchETagExcept("*")
		_, err := s.cli.PutObject(ctx, s.cfg.Bucket, key, body, size, opts)
		if err != nil {
			r := minio.ToErrorResponse(err)
			if r.StatusCode == http.StatusPreconditionFailed || r.Code == "PreconditionFailed" {
				if attempt > 0 {
					return errMaybeOurs
				}
				return errExists
			}
			if transient(err) {
				return err
			}
			return fmt.Errorf("s3: put %s: %w", key, err)
		}
		return nil
	})
}

// errMaybeOurs is an object found at the key on a retry: possibly written
// by our own earlier attempt.
var errMaybeOurs = fmt.Errorf("%w (after a retry)", errExists)

// Append adds e to the log (a create-only PUT of the next number, retried
// after re-reading the log when another writer got there first). It fails
// with ErrFenced if a stream e settles was claimed by another writer.
// Appends made at once through one Store share a record (group commit,
// group.go).
func (s *Store) Append(ctx context.Context, e schemas.ShardEntry) error {
	e.Writer = s.writer
	var nb [8]byte
	_, _ = rand.Read(nb[:])
	e.Nonce = hex.EncodeToString(nb[:])
	return s.enqueue(ctx, e)
}

// snapshot stores the snapshot after entry seq of log l: the segments it
// seals first (each created once; one already there, from a writer that
// sealed the same entries, holds the same bytes), then the snapshot, then
// l remembers the segments as sealed.
func (s *Store) snapshot(ctx context.Context, seq int64, snap []byte, segs []store.Segment, l *store.Log) error {
	for _, g := range segs {
		if err := s.manifest.Create(ctx, g.Name, g.Data); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("segment %s: %w", g.Name, err)
		}
	}
	if err := s.journal.Snapshot(ctx, seq, snap); err != nil {
		return err
	}
	s.mu.Lock()
	if s.log == l {
		l.Sealed(segs)
	}
	s.mu.Unlock()
	return nil
}

// isOurs reports whether log record seq holds one of entries (by its
// nonce: a snapshot keeps only some entries of a record), loading the
// log's sealed segments (bounded by ctx) if the record is in none it
// holds.
func (s *Store) isOurs(ctx context.Context, seq int64, entries []schemas.ShardEntry) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	has := func() bool {
		for _, e := range entries {
			if s.log.HasNonce(seq, e.Nonce) {
				return true
			}
		}
		return false
	}
	ok := has()
	if !ok && !s.log.Loaded() && s.loaded(ctx) == nil {
		ok = has()
	}
	return ok
}

// Claim appends a claim of streams for this writer in a Kafka generation
// (0 for files); later commits by their previous owners are fenced, and a
// claim older than a stream's latest is refused with ErrFenced. It then
// removes the orphans of writers that hold no claim any more.
//
// A claim of no stream (stdin, a gateway before its first segment, a Kafka
// worker given no partition) claims the writer's own stream
// (store.WriterStream), which nobody else claims: the writer names itself
// in the log, so that the objects named after it are the store's, and it
// holds a claim while it runs, so that no other writer takes an upload
// whose entry is about to be appended for an orphan. Its first claim of
// real streams gives its own stream up; a writer that only ever claimed
// its own stream and died leaves its orphans (nothing lists them: they
// are not data) for its own run id, which is never reused.
func (s *Store) Claim(ctx context.Context, streams []string, generation int64) error {
	if len(streams) == 0 {
		streams = []string{store.WriterStream(s.writer)}
	}
	if err := s.Append(ctx, schemas.ShardEntry{Claims: streams, Generation: generation, SchemaVersion: schemas.SchemaVersion, CommittedAt: time.Now().UTC()}); err != nil {
		return err
	}
	_, err := s.RemoveOrphans(ctx)
	return err
}

// Writer is the id this store writes as.
func (s *Store) Writer() string { return s.writer }

// Name is s3://bucket/prefix.
func (s *Store) Name() string { return "s3://" + s.cfg.Bucket + "/" + s.cfg.Prefix }

// Close releases nothing: the store holds no connection of its own.
func (s *Store) Close() error { return nil }

// Entries re-reads the log tail and returns the log (a copy).
func (s *Store) Entries(ctx context.Context) ([]schemas.ShardEntry, error) {
	if err := s.refresh(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.loaded(ctx); err != nil {
		return nil, err
	}
	return s.log.Entries(), nil
}

// Settled returns the union of the positions settled by every entry read.
func (s *Store) Settled() schemas.Settled {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.Settled()
}

// Sweep removes this writer's shards and dead letters that no entry lists.
func (s *Store) Sweep(ctx context.Context) error {
	_, err := s.RemoveOwnOrphans(ctx)
	return err
}

// DeadLetters returns this writer's dead-letter objects under _dlq/.
func (s *Store) DeadLetters() store.DeadLetters {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dl == nil {
		s.dl = &DeadLetters{s: s}
	}
	return s.dl
}

// Refresh re-reads the log tail (for readers following a live writer).
func (s *Store) Refresh(ctx context.Context) error { return s.refresh(ctx) }

// RemoveOrphans deletes shard and dead-letter objects that no entry lists
// and whose writer holds no claim (it is dead or fenced everywhere). It
// returns the keys removed. It lists the objects under the prefix only
// when there is a writer to look for: one that holds no claim and that
// this store has not cleaned up since its latest entry.
func (s *Store) RemoveOrphans(ctx context.Context) ([]string, error) {
	if err := s.refresh(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	live := s.log.Holders()
	live[s.writer] = true
	doomed := map[string]bool{}
	for _, w := range s.log.Writers() {
		if live[w] {
			continue
		}
		if at, ok := s.cleaned[w]; ok {
			if latest, seen := s.log.Latest(w); !seen || latest < at {
				continue
			}
		}
		doomed[w] = true
	}
	end := s.next
	s.mu.Unlock()
	if len(doomed) == 0 {
		return nil, nil
	}
	removed, err := s.removeUnlisted(ctx, []string{s.key("")}, func(w string, live map[string]bool) bool { return doomed[w] && !live[w] })
	if err == nil {
		s.mu.Lock()
		for w := range doomed {
			s.cleaned[w] = end
		}
		s.mu.Unlock()
	}
	return removed, err
}

// RemoveOwnOrphans deletes this writer's objects that no entry lists: call
// it when none of its commits is in flight (a generation ended, the run
// ends), so that a glob over the prefix never sees them. It lists only
// where they can be: this writer's names in the partitions it created
// shards in since its last sweep, and among the dead letters.
func (s *Store) RemoveOwnOrphans(ctx context.Context) ([]string, error) {
	s.mu.Lock()
	parts := make([]string, 0, len(s.touched))
	for p := range s.touched {
		parts = append(parts, p)
	}
	s.mu.Unlock()
	sort.Strings(parts)
	prefixes := []string{s.key(store.DeadLetterDir + "/" + s.writer + "-")}
	for _, p := range parts {
		prefixes = append(prefixes, s.key(strings.TrimPrefix(p+"/", "./")+"part-"+s.writer+"-"))
	}
	removed, err := s.removeUnlisted(ctx, prefixes, func(w string, _ map[string]bool) bool { return w == s.writer })
	if err == nil {
		s.mu.Lock()
		for _, p := range parts {
			delete(s.touched, p)
		}
		s.mu.Unlock()
	}
	return removed, err
}

// removeUnlisted lists the objects under prefixes first and reads the log
// after, so that an object committed between the two is seen as listed:
// a writer claims before it uploads and uploads before it appends.
func (s *Store) removeUnlisted(ctx context.Context, prefixes []string, doomed func(writer string, live map[string]bool) bool) ([]string, error) {
	var objs []minio.ObjectInfo
	err := s.cfg.retry(ctx, func(int) error {
		objs = objs[:0]
		for _, prefix := range prefixes {
			for obj := range s.cli.ListObjects(ctx, s.cfg.Bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
				if obj.Err != nil {
					return obj.Err
				}
				objs = append(objs, obj)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("s3: list: %w", err)
	}
	if err := s.refresh(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	live := s.log.Holders()
	live[s.writer] = true
	var doomedKeys []string
	for _, obj := range objs {
		rel := strings.TrimPrefix(obj.Key, s.key(""))
		w := store.ShardWriter(rel)
		if w == "" {
			w = dlqWriter(rel)
		}
		// Only what the store created: named after a writer the log knows.
		if w == "" || !s.log.Known(w) || !doomed(w, live) {
			continue
		}
		if !s.log.Listed(rel) {
			// A candidate: whether an old entry lists it is in the
			// sealed segments a writer has not read yet.
			if err := s.loaded(ctx); err != nil {
				s.mu.Unlock()
				return nil, err
			}
		}
		if !s.log.Listed(rel) {
			doomedKeys = append(doomedKeys, obj.Key)
		}
	}
	s.mu.Unlock()
	var removed []string
	for _, key := range doomedKeys {
		if err := s.remove(ctx, key); err != nil {
			return removed, fmt.Errorf("s3: remove orphan %s: %w", key, err)
		}
		removed = append(removed, key)
	}
	sort.Strings(removed)
	return removed, nil
}

// dlqWriter returns the writer of a dead-letter object,
// _dlq/<writer>-<seq>.jsonl, or "".
func dlqWriter(rel string) string {
	w := store.DeadLetterWriter(rel)
	if i := strings.LastIndexByte(w, '-'); i > 0 {
		if _, err := strconv.Atoi(w[i+1:]); err == nil {
			return w[:i]
		}
	}
	return ""
}

// Pending buffers a shard in a temporary file until Commit uploads it.
type Pending struct {
	s    *Store
	rel  string
	f    *os.File
	done bool
}

// Create starts a shard at rel (built from numbers and the writer only).
func (s *Store) Create(ctx context.Context, rel string) (store.Pending, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !store.CheckShardPath(rel) {
		return nil, fmt.Errorf("s3: shard path %q is not a clean relative data path", rel)
	}
	f, err := os.CreateTemp("", "rllm-pipe-shard-*.parquet")
	if err != nil {
		return nil, fmt.Errorf("s3: temporary shard: %w", err)
	}
	s.mu.Lock()
	s.touched[path.Dir(rel)] = true
	s.mu.Unlock()
	return &Pending{s: s, rel: rel, f: f}, nil
}

// Write implements io.Writer.
func (p *Pending) Write(b []byte) (int, error) { return p.f.Write(b) }

// Commit uploads the shard create-only (one PUT, see putIfAbsent), then
// appends e. A fenced or failed append leaves the upload as an orphan,
// removed here on a best-effort basis and otherwise by the next Open.
func (p *Pending) Commit(ctx context.Context, e schemas.ShardEntry) error {
	if p.done {
		return errors.New("s3: shard already committed or aborted")
	}
	p.done = true
	defer os.Remove(p.f.Name())
	defer p.f.Close()
	size, err := p.f.Seek(0, io.SeekEnd)
	if err != nil {
		return fmt.Errorf("s3: shard %s: %w", p.rel, err)
	}
	if _, err := p.f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("s3: shard %s: %w", p.rel, err)
	}
	key := p.s.key(p.rel)
	// An object found at the key on a retry is our own earlier attempt,
	// whose answer was lost (a shard key is unique to its writer's run and
	// sequence). One found at the first attempt is not ours: a committed
	// shard is never replaced, nor listed twice.
	switch err := p.s.putIfAbsent(ctx, key, p.f, size, "application/vnd.apache.parquet"); {
	case errors.Is(err, errMaybeOurs):
	case errors.Is(err, errExists):
		return fmt.Errorf("s3: shard %s: an object is already there: %w", p.rel, fs.ErrExist)
	case err != nil:
		return err
	}
	e.Path, e.Bytes = p.rel, size
	if err := p.s.Append(ctx, e); err != nil {
		// Only a fenced append is known not to have landed; after any other
		// failure the entry may be in the log, and the shard must stay (it
		// is removed by RemoveOwnOrphans if it is not listed).
		if errors.Is(err, ErrFenced) {
			_ = p.s.cli.RemoveObject(context.WithoutCancel(ctx), p.s.cfg.Bucket, key, minio.RemoveObjectOptions{})
		}
		return err
	}
	return nil
}

// Abort discards the shard.
func (p *Pending) Abort() error {
	if p.done {
		return nil
	}
	p.done = true
	p.f.Close()
	return os.Remove(p.f.Name())
}

// PutDeadLetters uploads a dead-letter object create-only and returns its
// key relative to the prefix.
func (s *Store) PutDeadLetters(ctx context.Context, seq int, data []byte) (string, error) {
	rel := fmt.Sprintf("_dlq/%s-%06d.jsonl", s.writer, seq)
	if err := s.putIfAbsent(ctx, s.key(rel), bytes.NewReader(data), int64(len(data)), "application/x-ndjson"); err != nil && !errors.Is(err, errExists) {
		return "", err
	}
	return rel, nil
}

// RemovePrefix deletes every object under cfg's prefix (DeleteAll on a
// reader of it): for tests and benchmarks that clean up after themselves.
func RemovePrefix(ctx context.Context, cfg Config) (int, error) {
	st, err := OpenReader(ctx, cfg, "cleanup")
	if err != nil {
		return 0, err
	}
	defer st.Close()
	return st.DeleteAll(ctx)
}

// DeleteAll deletes every object under the store's prefix, the manifest
// and its snapshots included, and returns how many: for benchmarks and
// tests that drop their own output (nothing in a run calls it). Other
// prefixes of the bucket are untouched; a store without a prefix is
// refused.
func (s *Store) DeleteAll(ctx context.Context) (int, error) {
	if s.cfg.Prefix == "" {
		return 0, fmt.Errorf("s3: %s: refusing to delete a whole bucket (the store has no prefix)", s.cfg)
	}
	var objects []minio.ObjectInfo
	for obj := range s.cli.ListObjects(ctx, s.cfg.Bucket, minio.ListObjectsOptions{Prefix: s.key(""), Recursive: true}) {
		if obj.Err != nil {
			return 0, fmt.Errorf("s3: list %s: %w", s.cfg, obj.Err)
		}
		objects = append(objects, obj)
	}
	feed := make(chan minio.ObjectInfo)
	go func() {
		defer close(feed)
		for _, obj := range objects {
			select {
			case feed <- obj:
			case <-ctx.Done():
				return
			}
		}
	}()
	var errs []error
	for r := range s.cli.RemoveObjects(ctx, s.cfg.Bucket, feed, minio.RemoveObjectsOptions{}) {
		errs = append(errs, fmt.Errorf("s3: delete %s: %w", r.ObjectName, r.Err))
	}
	if err := errors.Join(errs...); err != nil {
		return len(objects) - len(errs), err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return len(objects), nil
}

// remove deletes the object at key, retrying transient failures.
func (s *Store) remove(ctx context.Context, key string) error {
	return s.cfg.retry(ctx, func(int) error { return s.cli.RemoveObject(ctx, s.cfg.Bucket, key, minio.RemoveObjectOptions{}) })
}

// Get reads the object at rel under the prefix (fs.ErrNotExist if absent).
func (s *Store) Get(ctx context.Context, rel string) ([]byte, error) {
	if !store.CheckPath(rel) {
		return nil, fmt.Errorf("s3: path %q is not a clean relative path", rel)
	}
	data, missing, err := s.get(ctx, s.key(rel))
	if err != nil {
		return nil, fmt.Errorf("s3: get %s: %w", rel, err)
	}
	if missing {
		return nil, fmt.Errorf("s3: %s: %w", rel, fs.ErrNotExist)
	}
	return data, nil
}

// Client exposes the minio client and bucket, for tests and readers.
func (s *Store) Client() (*minio.Client, string) { return s.cli, s.cfg.Bucket }

// Key returns the object key of rel under the prefix.
func (s *Store) Key(rel string) string { return s.key(rel) }

type atomicCounter struct{ n atomic.Int64 }

func (c *atomicCounter) Add(d int64) { c.n.Add(d) }

// Load returns the count.
func (c *atomicCounter) Load() int64 { return c.n.Load() }
