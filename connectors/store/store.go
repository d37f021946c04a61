// Package store is the one interface to an output root: the committed
// Parquet shards, the manifest that lists them, the dead letters, the
// claims that fence a stream's previous writer, and the small create-only
// objects of the consumer groups' logs.
//
// Two backends implement it with the same guarantees: connectors/local (a
// directory: the embedded default) and connectors/s3 (S3 or MinIO);
// connectors.OpenStore and connectors.OpenReader pick one from a URL. The
// conformance suite in storetest runs the same tests against both, and a
// third backend needs only to pass it.
//
// The guarantees, on every backend:
//   - the manifest is the only truth: a shard is data once its entry is
//     appended, and a file or object it does not list is not, whatever its
//     footer says;
//   - a shard is invisible until its Commit lists it, and its bytes are
//     never seen partially written;
//   - manifest entries form one linear log: every writer that appends has
//     read every entry before its own;
//   - a second writer cannot corrupt the root: it is refused (the local
//     directory's lock) or it fences the first, whose later commits of the
//     streams it claimed fail with ErrFenced (S3);
//   - a writer removes only what it created: its temporary files, and its
//     own shards and dead letters that no entry lists (orphans of a crash
//     or of a failed append).
package store

import (
	"context"
	"errors"
	"io"

	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// ErrFenced is a commit refused because another writer claimed one of the
// streams it settles (or a claim older than the stream's latest).
var ErrFenced = errors.New("store: fenced: another writer claimed the stream")

// ErrLocked is a writer refused because another writer holds the root.
var ErrLocked = errors.New("store: another writer holds the output root")

type retryStopKey struct{}

// WithRetryStop returns ctx carrying stop: a backend retrying a transient
// failure (an outage) gives up when stop is closed, with an error, while
// requests in flight are not cancelled. Pipelines pass their soft stop,
// so that a first signal during an outage ends the run instead of
// waiting for the store to return.
func WithRetryStop(ctx context.Context, stop <-chan struct{}) context.Context {
	return context.WithValue(ctx, retryStopKey{}, stop)
}

// RetryStop is the stop ctx carries (nil, never closed, if none).
func RetryStop(ctx context.Context) <-chan struct{} {
	stop, _ := ctx.Value(retryStopKey{}).(<-chan struct{})
	return stop
}

// Reader reads an output root's committed data. It writes nothing there
// but the consumer groups' objects. Safe for concurrent use.
type Reader interface {
	// Name describes the root (a path or s3://bucket/prefix), without
	// secrets.
	Name() string
	// Entries re-reads the manifest and returns every entry in log order:
	// shards, and checkpoints and claims (entries without a Path).
	Entries(ctx context.Context) ([]schemas.ShardEntry, error)
	// Committed is Entries without the entries that list no shard.
	Committed(ctx context.Context) ([]schemas.ShardEntry, error)
	// CommittedFrom is Committed without its first n entries: a follower
	// that holds them reads only what is new (the list only grows).
	CommittedFrom(ctx context.Context, n int) ([]schemas.ShardEntry, error)
	// EntriesFrom returns the entries from the nth shard entry on (n
	// counts from 0): that shard entry, then every later entry of every
	// kind, each with Seq set to its place in the manifest; nil when the
	// manifest lists n shards or fewer. EntriesFrom(0) is Entries, with
	// every Seq set. A reader that holds the manifest up to a known shard
	// (a snapshot) reads only the rest.
	EntriesFrom(ctx context.Context, n int) ([]schemas.ShardEntry, error)
	// ReadShard opens a committed shard for reading the named columns
	// (all when none).
	ReadShard(ctx context.Context, e schemas.ShardEntry, columns []string, mem memory.Allocator) (*parquet.Reader, error)
	// Get reads a small committed object by its path under the root, such
	// as a dead-letter file an entry names (an error wrapping
	// fs.ErrNotExist if absent).
	Get(ctx context.Context, rel string) ([]byte, error)
	// Objects returns the folder dir under the root as a set of small
	// create-only objects.
	Objects(dir string) (Objects, error)
	Close() error
}

// Store is an output root opened by one writer (a run, named by its id).
// Safe for concurrent use.
type Store interface {
	Reader
	// Writer is the id of this writer, in its entries and object names.
	Writer() string
	// Claim appends a claim of streams for this writer in a Kafka
	// generation (0 for files): later commits of those streams by their
	// previous owners are fenced; a claim older than a stream's latest is
	// refused with ErrFenced.
	Claim(ctx context.Context, streams []string, generation int64) error
	// Create starts a shard at rel, a clean slash-separated path under the
	// root outside the folders whose names start with "_", built from
	// sanitised parts (never from record ids).
	Create(ctx context.Context, rel string) (Pending, error)
	// Append lists e in the manifest: a checkpoint without a shard. It
	// fails with ErrFenced if a stream e settles was claimed by another
	// writer.
	Append(ctx context.Context, e schemas.ShardEntry) error
	// Settled returns the union of the positions settled by every entry
	// read so far: a run skips them.
	Settled() schemas.Settled
	// DeadLetters returns this writer's dead-letter output under the root.
	DeadLetters() DeadLetters
	// Sweep removes this writer's shards and dead letters that no entry
	// lists. Call it when none of its commits is in flight (a generation
	// or the run ended), so that a glob over the root never sees them.
	Sweep(ctx context.Context) error
}

// Pending is a shard being written; its bytes are invisible to readers
// until Commit publishes it and lists it in the manifest.
type Pending interface {
	io.Writer
	// Commit publishes the shard and appends e with its Path and Bytes
	// set. After it returns nil the shard is durable and listed.
	Commit(ctx context.Context, e schemas.ShardEntry) error
	// Abort discards the shard; a no-op after Commit.
	Abort() error
}

// Objects is a folder of small objects, each created at most once: of two
// creators of a name exactly one wins, and a reader never sees a partial
// object.
type Objects interface {
	// Create writes name unless it exists (an error wrapping fs.ErrExist).
	// After a retried request fs.ErrExist may mean that the first attempt
	// landed: callers put a nonce in data and read it back.
	Create(ctx context.Context, name string, data []byte) error
	// Get reads name (an error wrapping fs.ErrNotExist if absent).
	Get(ctx context.Context, name string) ([]byte, error)
	// List returns the names that start with prefix, sorted.
	List(ctx context.Context, prefix string) ([]string, error)
	// Delete removes name; removing a name that is absent is not an error.
	Delete(ctx context.Context, name string) error
}

// DeadLetters is a dead-letter output: letters are written as they come,
// made durable at each checkpoint, which hands over the positions they
// settle for the next manifest entry.
type DeadLetters interface {
	// Write adds letters and notes the positions of letters and of
	// records dropped as retries as pending.
	Write(ctx context.Context, letters []schemas.DeadLetter, dropped []schemas.Source) error
	// Checkpoint makes every letter written so far durable and returns the
	// positions settled since the last checkpoint, with the output's
	// durable state (nil when it has nothing to record).
	Checkpoint(ctx context.Context) (schemas.Settled, *schemas.DeadLetterState, error)
	// Reset forgets what was written since the last checkpoint: a Kafka
	// generation ended and those records go to the stream's next owner.
	Reset()
	// Counts returns the letters written, by reason.
	Counts() map[schemas.Reason]int64
	// Name describes where the letters go.
	Name() string
	Close() error
}
