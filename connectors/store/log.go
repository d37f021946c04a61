package store

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"sort"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Log is a manifest replayed: its entries in order, the latest claim of
// each stream and the union of the positions settled, kept current entry
// by entry, with the fencing rules an appender checks. It serves a
// backend shared by many writers (S3); the local directory, one writer at
// a time under its lock, keeps only the figures it needs (local/state.go).
// Not safe for concurrent use: backends hold their own lock.
type Log struct {
	entries []schemas.ShardEntry
	shards  []int // the entries that list a shard, by index
	kept    []int // the entries a snapshot keeps (a shard or dead letters), by index
	// segs are the sealed segments holding the first kept entries, as the
	// snapshot this log was restored from listed them plus those its own
	// snapshots sealed.
	segs []SegmentRef
	// unloaded counts the kept entries of the first segments, which a log
	// restored with RestoreHead has not read yet (Load reads them).
	unloaded int
	load     func(ctx context.Context, name string) ([]byte, error)
	claims   map[string]claim
	settled  schemas.Settled
	listed   map[string]bool // shard paths and dead-letter files listed
	writers  map[string]bool // writers and runs that appended an entry
	// latest is the sequence number of each writer's latest entry among
	// those applied (not the ones a snapshot folded in).
	latest map[string]int64
}

// claim is who last claimed a stream, in which Kafka generation.
type claim struct {
	writer     string
	generation int64
}

// NewLog returns an empty log.
func NewLog() *Log {
	return &Log{claims: map[string]claim{}, settled: schemas.Settled{}, listed: map[string]bool{}, writers: map[string]bool{}, latest: map[string]int64{}}
}

// Apply replays e, the next entry.
func (l *Log) Apply(e schemas.ShardEntry) {
	if e.Path != "" {
		l.shards = append(l.shards, len(l.entries))
	}
	if e.Path != "" || e.DeadLetters != nil {
		l.kept = append(l.kept, len(l.entries))
	}
	l.entries = append(l.entries, e)
	for _, c := range e.Claims {
		l.claims[c] = claim{e.Writer, e.Generation}
	}
	if own := WriterStream(e.Writer); len(e.Claims) > 0 && e.Claims[0] != own {
		delete(l.claims, own) // real streams now: it holds a claim while it holds those
	}
	l.settled.Union(e.Settled)
	if e.Path != "" {
		l.listed[e.Path] = true
	}
	if e.DeadLetters != nil {
		l.listed[e.DeadLetters.File] = true
	}
	if e.Writer != "" {
		l.writers[e.Writer] = true
		l.latest[e.Writer] = max(l.latest[e.Writer], e.Seq)
	}
	if e.RunID != "" {
		l.writers[e.RunID] = true
	}
}

// Entries returns the entries (a copy).
func (l *Log) Entries() []schemas.ShardEntry { return append([]schemas.ShardEntry(nil), l.entries...) }

// Committed returns the entries that list a shard.
func (l *Log) Committed() []schemas.ShardEntry { return l.CommittedFrom(0) }

// CommittedFrom returns the entries that list a shard from the nth on
// (copies): a follower that holds the first n asks only for the rest.
// The shard entries of a log only ever grow at the end, also across a
// snapshot (RestoreLog keeps them all, in order).
//
// A log restored with RestoreHead must have read the shards asked for
// (LoadFrom(n) or Load).
func (l *Log) CommittedFrom(n int) []schemas.ShardEntry {
	before, _ := l.unloadedShards()
	k := max(n-before, 0) // the log holds the shards from the before-th on
	if k >= len(l.shards) {
		return nil
	}
	out := make([]schemas.ShardEntry, 0, len(l.shards)-k)
	for _, i := range l.shards[k:] {
		out = append(out, l.entries[i])
	}
	return out
}

// EntriesFrom returns the entries from the nth shard entry on (copies):
// that entry, then every later one. A log restored with RestoreHead must
// have read the shards asked for (LoadFrom(n) or Load).
func (l *Log) EntriesFrom(n int) []schemas.ShardEntry {
	before, _ := l.unloadedShards()
	k := n - before // the log holds the shards from the before-th on
	if k < 0 || k >= len(l.shards) {
		return nil
	}
	return append([]schemas.ShardEntry(nil), l.entries[l.shards[k]:]...)
}

// unloadedSegs returns the segments a log restored with RestoreHead has
// not read: the first ones.
func (l *Log) unloadedSegs() []SegmentRef {
	var refs []SegmentRef
	n := 0
	for _, ref := range l.segs {
		if n >= l.unloaded {
			break
		}
		refs = append(refs, ref)
		n += ref.Count
	}
	return refs
}

// unloadedShards returns how many shard entries the segments not read
// hold; false if a segment does not say.
func (l *Log) unloadedShards() (int, bool) {
	total := 0
	for _, ref := range l.unloadedSegs() {
		if ref.Shards == nil {
			return 0, false
		}
		total += *ref.Shards
	}
	return total, true
}

// HasNonce reports whether an entry of record seq carries nonce (a
// group commit's record holds several entries).
func (l *Log) HasNonce(seq int64, nonce string) bool {
	for i := len(l.entries) - 1; i >= 0 && l.entries[i].Seq >= seq; i-- {
		if l.entries[i].Seq == seq && l.entries[i].Nonce == nonce {
			return true
		}
	}
	return false
}

// Settled returns the union of the positions settled by every entry (a
// copy).
func (l *Log) Settled() schemas.Settled { return CloneSettled(l.settled) }

// Listed reports whether an entry lists rel as a shard or a dead-letter
// file.
func (l *Log) Listed(rel string) bool { return l.listed[rel] }

// Known reports whether writer appended an entry (it is a writer of this
// store, so the objects named after it are the store's).
func (l *Log) Known(writer string) bool { return l.writers[writer] }

// Writers returns the writers and runs that appended an entry.
func (l *Log) Writers() []string {
	out := make([]string, 0, len(l.writers))
	for w := range l.writers {
		out = append(out, w)
	}
	sort.Strings(out)
	return out
}

// Latest returns the sequence number of writer's latest entry applied to
// this log (snapshots fold entries in without it); false if none was.
func (l *Log) Latest(writer string) (int64, bool) {
	seq, ok := l.latest[writer]
	return seq, ok
}

// WriterStream is the stream a writer claims when it claims no input
// stream (s3.Store.Claim): its own, which no other writer claims. It
// settles no position.
func WriterStream(writer string) string { return "_writer/" + writer }

// Holders returns the writers that hold a claim.
func (l *Log) Holders() map[string]bool {
	out := map[string]bool{}
	for _, c := range l.claims {
		out[c.writer] = true
	}
	return out
}

// Fenced returns a stream that e may not touch when writer appends it: a
// stream e settles whose latest claim is another writer's, or a stream e
// claims whose latest claim is of a newer generation (a slow worker's
// claim, landing after the rebalance that moved the stream on, must not
// take the stream back). It returns "" when e may be appended.
func (l *Log) Fenced(e *schemas.ShardEntry, writer string) string {
	for stream := range e.Settled {
		if c, ok := l.claims[stream]; ok && c.writer != writer {
			return stream
		}
	}
	for _, stream := range e.Claims {
		if c, ok := l.claims[stream]; ok && c.generation > e.Generation {
			return stream
		}
	}
	return ""
}

// writerID is the shape of the ids that name writers: ingest's run ids
// (20060102T150405Z-<hex>) and the names tests and tools give, made of
// letters, digits, '.', '_' and '-'.
var writerID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// CheckWriter rejects a writer id that is unsafe in object names.
func CheckWriter(id string) bool { return writerID.MatchString(id) }

// ShardWriter returns the writer of a shard named by the sink's pattern,
// <partition>/part-<writer>-<seq>.parquet, with the partition one folder
// directly under the root; "" for any other path (not the store's).
func ShardWriter(rel string) string {
	dir, name := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" || strings.Contains(dir, "/") || !strings.HasPrefix(dir, schemas.PartitionKey+"=") || !strings.HasPrefix(name, "part-") || !strings.HasSuffix(name, ".parquet") {
		return ""
	}
	return splitSeq(strings.TrimSuffix(strings.TrimPrefix(name, "part-"), ".parquet"))
}

// DeadLetterWriter returns the writer of a dead-letter file named
// _dlq/<writer>.jsonl or _dlq/<writer>-<seq>.jsonl; "" for any other path.
func DeadLetterWriter(rel string) string {
	name, ok := strings.CutPrefix(rel, DeadLetterDir+"/")
	if !ok || strings.Contains(name, "/") || !strings.HasSuffix(name, ".jsonl") {
		return ""
	}
	name = strings.TrimSuffix(name, ".jsonl")
	if !CheckWriter(name) {
		return ""
	}
	return name
}

// splitSeq returns w of w-<digits>, or "".
func splitSeq(s string) string {
	i := strings.LastIndexByte(s, '-')
	if i <= 0 || i == len(s)-1 {
		return ""
	}
	for _, c := range s[i+1:] {
		if c < '0' || c > '9' {
			return ""
		}
	}
	if !CheckWriter(s[:i]) {
		return ""
	}
	return s[:i]
}

// Folder names under a root; names starting with "_" hold what is not
// shard data.
const (
	ManifestDir   = "_manifest"
	DeadLetterDir = "_dlq"
	ConsumersDir  = "_consumers"
)

// CheckShardPath rejects shard paths that could leave the root or land in
// a folder that is not data.
func CheckShardPath(rel string) bool {
	return rel != "" && !path.IsAbs(rel) && path.Clean(rel) == rel && !strings.HasPrefix(rel, "..") &&
		!strings.ContainsAny(rel, "\\\x00") && !strings.HasPrefix(rel, "_") && !strings.Contains(rel, "/_")
}

// CheckPath rejects object paths that could leave the root.
func CheckPath(rel string) bool {
	return rel != "" && !path.IsAbs(rel) && path.Clean(rel) == rel && rel != ".." && !strings.HasPrefix(rel, "../") &&
		!strings.ContainsAny(rel, "\\\x00")
}

// CloneSettled returns a deep copy of s.
func CloneSettled(s schemas.Settled) schemas.Settled {
	out := make(schemas.Settled, len(s))
	for k, v := range s {
		out[k] = append(schemas.Ranges(nil), v...)
	}
	return out
}

// CheckName rejects an object name that is not one plain path element.
func CheckName(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, "/\\\x00")
}

// logSnapshot is a Log as a journal snapshot stores it: the entries that
// list a shard or a dead-letter file (readers list them), and what the
// others contributed, folded: claims, settled positions, writers. The
// kept entries are in sealed segments (immutable objects listed in
// order, each written once before any snapshot names it) followed by the
// tail in Entries, so a snapshot stays small however long the run: a new
// one writes only what was sealed since, never the whole list again.
// Snapshots without Segments (older ones) hold every kept entry in
// Entries.
type logSnapshot struct {
	Next     int64                `json:"next"`
	Segments []SegmentRef         `json:"segments,omitempty"`
	Entries  []schemas.ShardEntry `json:"entries"`
	Claims   map[string]claimJSON `json:"claims,omitempty"`
	Settled  schemas.Settled      `json:"settled,omitempty"`
	Writers  []string             `json:"writers,omitempty"`
}

// SegmentRef names a sealed segment of a log's kept entries: Count of
// them from the First (0 is the first kept entry of the log), of which
// Shards list a shard (absent in segments sealed before it was counted).
type SegmentRef struct {
	Name   string `json:"name"`
	First  int    `json:"first"`
	Count  int    `json:"count"`
	Shards *int   `json:"shards,omitempty"`
}

// Segment is a segment to write before the snapshot that names it.
type Segment struct {
	SegmentRef
	Data []byte
}

// SegmentName is the object name of the segment of count kept entries
// from first: the same for every writer that seals them, and the same
// bytes, since the log is linear.
func SegmentName(first, count int) string { return fmt.Sprintf("seg-%020d-%08d.json", first, count) }

type claimJSON struct {
	Writer     string `json:"writer"`
	Generation int64  `json:"generation,omitempty"`
}

// Snapshot encodes the log, whose next entry is next, for RestoreLog,
// sealing every full run of segSize kept entries after the log's sealed
// segments into a new segment (segSize <= 0: none; the snapshot then
// holds the whole tail). The segments it returns must be created before
// the snapshot (create-only; one that exists already holds the same
// entries), and Sealed called once the snapshot is stored.
func (l *Log) Snapshot(next int64, segSize int) ([]byte, []Segment, error) {
	s := logSnapshot{Next: next, Segments: append([]SegmentRef(nil), l.segs...), Claims: map[string]claimJSON{}, Settled: l.settled}
	sealed := 0
	for _, g := range l.segs {
		sealed += g.Count
	}
	var segs []Segment
	for segSize > 0 && l.unloaded+len(l.kept)-sealed >= segSize {
		part := make([]schemas.ShardEntry, segSize)
		for i, k := range l.kept[sealed-l.unloaded : sealed-l.unloaded+segSize] {
			part[i] = l.entries[k]
		}
		data, err := json.Marshal(part)
		if err != nil {
			return nil, nil, fmt.Errorf("store: log segment: %w", err)
		}
		shards := 0
		for _, e := range part {
			if e.Path != "" {
				shards++
			}
		}
		ref := SegmentRef{Name: SegmentName(sealed, segSize), First: sealed, Count: segSize, Shards: &shards}
		segs = append(segs, Segment{ref, data})
		s.Segments = append(s.Segments, ref)
		sealed += segSize
	}
	s.Entries = make([]schemas.ShardEntry, 0, l.unloaded+len(l.kept)-sealed)
	for _, k := range l.kept[sealed-l.unloaded:] {
		s.Entries = append(s.Entries, l.entries[k])
	}
	for stream, c := range l.claims {
		s.Claims[stream] = claimJSON{c.writer, c.generation}
	}
	for w := range l.writers {
		s.Writers = append(s.Writers, w)
	}
	sort.Strings(s.Writers)
	data, err := json.Marshal(s)
	return data, segs, err
}

// Sealed records segments a stored snapshot names, so that the next
// snapshot names them too instead of sealing them again.
func (l *Log) Sealed(segs []Segment) {
	sealed := 0
	for _, g := range l.segs {
		sealed += g.Count
	}
	for _, g := range segs {
		if g.First != sealed {
			return // not this log's next segment (the log was replaced)
		}
		l.segs = append(l.segs, g.SegmentRef)
		sealed += g.Count
	}
}

// RestoreLog decodes a Snapshot and returns the log and its next entry;
// load reads a segment the snapshot names (segments are read
// concurrently, at most 8 at a time).
func RestoreLog(ctx context.Context, data []byte, load func(ctx context.Context, name string) ([]byte, error)) (*Log, int64, error) {
	l, next, err := RestoreHead(data, load)
	if err != nil {
		return nil, 0, err
	}
	if err := l.Load(ctx); err != nil {
		return nil, 0, err
	}
	return l, next, nil
}

// RestoreHead is RestoreLog without reading the segments: the log knows
// its claims, settled positions and writers, and can append and
// snapshot, but its entries, Listed and Last see only the snapshot's
// tail and what came after it until Load reads the segments (a writer
// needs them only to recognise orphans). A writer's open no longer
// grows with the run.
func RestoreHead(data []byte, load func(ctx context.Context, name string) ([]byte, error)) (*Log, int64, error) {
	var s logSnapshot
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, 0, fmt.Errorf("store: log snapshot: %w", err)
	}
	first := 0
	for i, ref := range s.Segments {
		if ref.First != first || ref.Count <= 0 || !CheckName(ref.Name) {
			return nil, 0, fmt.Errorf("store: log snapshot: segment %d (%+v) does not follow the one before", i, ref)
		}
		first += ref.Count
	}
	l := NewLog()
	for _, e := range s.Entries {
		l.Apply(e)
	}
	l.segs, l.unloaded, l.load = s.Segments, first, load
	for stream, c := range s.Claims {
		l.claims[stream] = claim{c.Writer, c.Generation}
	}
	l.settled.Union(s.Settled)
	for _, w := range s.Writers {
		l.writers[w] = true
	}
	return l, s.Next, nil
}

// Loaded reports whether every entry of the log is in memory.
func (l *Log) Loaded() bool { return l.unloaded == 0 }

// Load reads the segments a log restored with RestoreHead has not read,
// concurrently (at most 8 at a time), and puts their entries before the
// others. Claims, settled positions and writers are the snapshot's
// already (it folded the segments' in).
func (l *Log) Load(ctx context.Context) error {
	if l.unloaded == 0 {
		return nil
	}
	return l.loadSegs(ctx, l.unloadedSegs())
}

// LoadFrom reads only the segments not read yet that hold the shard
// entries from the nth on (all of them if a segment does not say how many
// it holds): a follower that starts late in a long log reads the last
// segments, not every one.
func (l *Log) LoadFrom(ctx context.Context, n int) error {
	refs := l.unloadedSegs()
	if len(refs) == 0 {
		return nil
	}
	before, ok := l.unloadedShards()
	if !ok {
		return l.loadSegs(ctx, refs)
	}
	if n >= before {
		return nil // in what the log holds already
	}
	// Keep the segments from the one holding shard n.
	k, cum := 0, 0
	for k < len(refs) && cum+*refs[k].Shards <= n {
		cum += *refs[k].Shards
		k++
	}
	return l.loadSegs(ctx, refs[k:])
}

// loadSegs reads refs, the last of the segments not read yet, and puts
// their entries before the others.
func (l *Log) loadSegs(ctx context.Context, refs []SegmentRef) error {
	if len(refs) == 0 {
		return nil
	}
	parts := make([][]schemas.ShardEntry, len(refs))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i, ref := range refs {
		g.Go(func() error {
			b, err := l.load(gctx, ref.Name)
			if err != nil {
				return fmt.Errorf("store: log segment %s: %w", ref.Name, err)
			}
			if err := json.Unmarshal(b, &parts[i]); err != nil {
				return fmt.Errorf("store: log segment %s: %w", ref.Name, err)
			}
			if len(parts[i]) != ref.Count {
				return fmt.Errorf("store: log segment %s holds %d entries, not %d", ref.Name, len(parts[i]), ref.Count)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	var entries []schemas.ShardEntry
	var kept, shards []int
	for _, part := range parts {
		for _, e := range part {
			if e.Path != "" {
				shards = append(shards, len(entries))
				l.listed[e.Path] = true
			}
			if e.DeadLetters != nil {
				l.listed[e.DeadLetters.File] = true
			}
			kept = append(kept, len(entries))
			entries = append(entries, e)
		}
	}
	off := len(entries)
	for _, k := range l.kept {
		kept = append(kept, k+off)
	}
	for _, k := range l.shards {
		shards = append(shards, k+off)
	}
	l.entries, l.kept, l.shards, l.unloaded = append(entries, l.entries...), kept, shards, refs[0].First
	return nil
}
