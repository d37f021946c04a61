package parquet

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sort"
	"sync"
	"unsafe"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/flight"
	"github.com/apache/arrow-go/v18/arrow/memory"
	pq "github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/metadata"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
	"github.com/apache/arrow-go/v18/parquet/schema"
	"github.com/klauspost/compress/huff0"
)

// nativeWriter writes Parquet files of the flat, list and map columns that
// rllm-pipe's schemas use, straight from Arrow buffers: levels as RLE runs
// computed from list offsets and validity, values copied as they lie,
// one zstd call per page. arrow-go's writer (the reference path, still
// used for other schemas) spends more than the compression itself on
// level arrays, pooled page buffers it zeroes on every reuse, and copies;
// here a page costs one copy and one compression. The footer is built
// with arrow-go's metadata package, so the files are ordinary Parquet:
// the schema is pqarrow's mapping of the Arrow schema, stored with it.
//
// Left out, against pqarrow: statistics of nested leaves (list elements,
// map keys and values), dictionary encoding (zstd makes up most of it on
// our strings), page statistics and indexes, and bit-packed level runs
// (levels are RLE runs only: alternating nulls cost two bytes per value
// before compression).
type nativeWriter struct {
	w        *countingWriter
	leaves   []*leaf
	meta     *metadata.FileMetaDataBuilder
	codec    *fastZstd
	level    int
	compact  bool // entropy-coded zstd literals (Options.Compact)
	pageSize int
	rgMax    int64
	maxStats int64 // min/max values longer than this are left out
	rgRows   int
	rgs      int16
	rows     int64
	body     []byte // a page before compression
	info     *schemaInfo
	levels   []byte // a page's levels
	zbuf     []byte // a page after compression
	lbuf     []byte // a page in another mode, when probing
	dbuf     []byte // a page with DELTA_BINARY_PACKED or DELTA_BYTE_ARRAY values
	fbuf     []byte // dbuf compressed, when probing
	lens     []byte // scratch of appendDeltaByteArray
	huff     huff0.Scratch
	hdr      []byte
}

type leafShape uint8

const (
	shapeFlat     leafShape = iota // a primitive column
	shapeList                      // list<primitive>, elements not null
	shapeMapKey                    // map<k, v>: the keys
	shapeMapValue                  // map<k, v>: the values
)

// leaf is one Parquet leaf column and the page and column chunk it is
// filling.
type leaf struct {
	field    int
	shape    leafShape
	typ      arrow.Type // of the values
	nullable bool       // the top-level field
	maxDef   int16
	maxRep   int16
	stats    *stats
	signed   bool // the column's statistics sort order is SIGNED
	path     string

	rep, def levelRuns
	vals     []byte // the page's values, after gap bytes kept for its levels
	gap      int
	nbits    int // booleans: bits used in vals
	levels   int // level entries in the page (its num_values)

	mode         *columnMode // how the column's pages are compressed (compressPage)
	chunk        []byte      // compressed pages of the row group
	chunkLevels  int64
	uncompressed int64
	pages        [encodingFront + 1]int32 // pages in chunk by the encoding of their values
}

// schemaInfo is what a writer needs of a schema, computed once per schema.
type schemaInfo struct {
	parquet *schema.Schema
	arrowKV string // ARROW:schema, as pqarrow stores it
	err     error
	modes   [2][]columnMode // per leaf, for default and compact writers
	bufs    chan *writerBufs
}

var schemaCache sync.Map // *arrow.Schema → *schemaInfo

// newNativeWriter returns a native writer for sc, or nil when sc has a
// column it does not handle.
func newNativeWriter(w *countingWriter, sc *arrow.Schema, opts Options, meta map[string]string) (*nativeWriter, error) {
	info, ok := nativeSchema(sc)
	if !ok {
		return nil, nil
	}
	if info.err != nil {
		return nil, info.err
	}
	props := []pq.WriterProperty{
		pq.WithCompression(compress.Codecs.Zstd),
		pq.WithCompressionLevel(opts.ZstdLevel),
		pq.WithDictionaryDefault(false),
		pq.WithCreatedBy(createdBy),
	}
	wprops := pq.NewWriterProperties(props...)
	kv := metadata.NewKeyValueMetadata()
	if err := kv.Append("ARROW:schema", info.arrowKV); err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(meta))
	for k := range meta {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if err := kv.Append(k, meta[k]); err != nil {
			return nil, fmt.Errorf("parquet: metadata %q: %w", k, err)
		}
	}
	codec, err := pageCodec()
	if err != nil {
		return nil, fmt.Errorf("parquet: zstd: %w", err)
	}
	nw := &nativeWriter{
		w:        w,
		meta:     metadata.NewFileMetadataBuilder(info.parquet, wprops, kv),
		codec:    codec,
		level:    opts.ZstdLevel,
		compact:  opts.Compact,
		pageSize: 1 << 20,
		rgMax:    opts.RowGroupBytes,
		maxStats: wprops.MaxStatsSize(),
	}
	if nw.leaves, err = planLeaves(sc, info.parquet); err != nil {
		return nil, err
	}
	for i, l := range nw.leaves {
		l.mode = &info.modes[b2i(opts.Compact)][i]
	}
	nw.info = info
	select {
	case b := <-info.bufs:
		nw.take(b)
	default:
	}
	if _, err := w.Write([]byte("PAR1")); err != nil {
		return nil, fmt.Errorf("parquet: write: %w", err)
	}
	return nw, nil
}

// nativeSchema reports whether every column of sc is one the native writer
// handles, and the schema's Parquet form.
func nativeSchema(sc *arrow.Schema) (*schemaInfo, bool) {
	for _, f := range sc.Fields() {
		if !nativeField(f) {
			return nil, false
		}
	}
	if v, ok := schemaCache.Load(sc); ok {
		return v.(*schemaInfo), true
	}
	info := &schemaInfo{bufs: make(chan *writerBufs, runtime.GOMAXPROCS(0))}
	info.parquet, info.err = pqarrow.ToParquet(sc, pq.NewWriterProperties(), pqarrow.NewArrowWriterProperties(pqarrow.WithStoreSchema()))
	if info.err == nil {
		info.arrowKV, info.err = storedArrowSchema(sc)
		info.modes = [2][]columnMode{make([]columnMode, info.parquet.NumColumns()), make([]columnMode, info.parquet.NumColumns())}
	}
	schemaCache.Store(sc, info)
	return info, true
}

// storedArrowSchema is the ARROW:schema value pqarrow stores for sc (read
// back from an empty file, so that both writers store the same bytes).
func storedArrowSchema(sc *arrow.Schema) (string, error) {
	var buf bytes.Buffer
	fw, err := pqarrow.NewFileWriter(sc, &buf, pq.NewWriterProperties(), pqarrow.NewArrowWriterProperties(pqarrow.WithStoreSchema()))
	if err != nil {
		return "", fmt.Errorf("parquet: schema: %w", err)
	}
	if err := fw.Close(); err != nil {
		return "", fmt.Errorf("parquet: schema: %w", err)
	}
	md, err := fw.FileMetadata()
	if err != nil {
		return "", fmt.Errorf("parquet: schema: %w", err)
	}
	if v := md.KeyValueMetadata().FindValue("ARROW:schema"); v != nil {
		return *v, nil
	}
	return base64.StdEncoding.EncodeToString(flight.SerializeSchema(sc, memory.DefaultAllocator)), nil
}

func nativeValueType(t arrow.DataType) bool {
	switch t.ID() {
	case arrow.INT32, arrow.INT64, arrow.FLOAT32, arrow.FLOAT64, arrow.BOOL, arrow.STRING, arrow.BINARY:
		return true
	case arrow.TIMESTAMP:
		u := t.(*arrow.TimestampType).Unit
		return u == arrow.Millisecond || u == arrow.Microsecond
	}
	return false
}

func nativeField(f arrow.Field) bool {
	switch t := f.Type.(type) {
	case *arrow.ListType:
		el := t.ElemField()
		return !el.Nullable && nativeValueType(el.Type) && el.Type.ID() != arrow.BOOL
	case *arrow.MapType:
		return !t.KeyField().Nullable && nativeValueType(t.KeyType()) && nativeValueType(t.ItemType()) &&
			t.KeyType().ID() != arrow.BOOL && t.ItemType().ID() != arrow.BOOL
	default:
		return nativeValueType(f.Type)
	}
}

// planLeaves maps the Arrow fields to Parquet leaves, checking the levels
// pqarrow's schema gives against the ones this writer emits.
func planLeaves(sc *arrow.Schema, ps *schema.Schema) ([]*leaf, error) {
	var leaves []*leaf
	add := func(field int, shape leafShape, typ arrow.DataType, nullable bool, wantDef, wantRep int16) error {
		i := len(leaves)
		if i >= ps.NumColumns() {
			return fmt.Errorf("parquet: schema has %d leaves, expected more", ps.NumColumns())
		}
		col := ps.Column(i)
		if col.MaxDefinitionLevel() != wantDef || col.MaxRepetitionLevel() != wantRep {
			return fmt.Errorf("parquet: column %s: levels %d/%d, expected %d/%d", col.Path(),
				col.MaxDefinitionLevel(), col.MaxRepetitionLevel(), wantDef, wantRep)
		}
		l := &leaf{field: field, shape: shape, typ: typ.ID(), nullable: nullable, maxDef: wantDef, maxRep: wantRep,
			path: col.Path(), signed: col.SortOrder() == schema.SortSIGNED}
		l.rep, l.def = newLevelRuns(wantRep), newLevelRuns(wantDef)
		if shape == shapeList {
			l.gap = levelGap
			l.vals = make([]byte, levelGap)
		}
		if shape == shapeFlat && !slices.Contains(noStats, l.path) {
			l.stats = &stats{}
		}
		leaves = append(leaves, l)
		return nil
	}
	for i, f := range sc.Fields() {
		n := int16(0)
		if f.Nullable {
			n = 1
		}
		var err error
		switch t := f.Type.(type) {
		case *arrow.ListType:
			err = add(i, shapeList, t.Elem(), f.Nullable, n+1, 1)
		case *arrow.MapType:
			if err = add(i, shapeMapKey, t.KeyType(), f.Nullable, n+1, 1); err == nil {
				v := int16(0)
				if t.ItemField().Nullable {
					v = 1
				}
				err = add(i, shapeMapValue, t.ItemType(), f.Nullable, n+1+v, 1)
			}
		default:
			err = add(i, shapeFlat, f.Type, f.Nullable, n, 0)
		}
		if err != nil {
			return nil, err
		}
	}
	if len(leaves) != ps.NumColumns() {
		return nil, fmt.Errorf("parquet: schema has %d leaves, planned %d", ps.NumColumns(), len(leaves))
	}
	return leaves, nil
}

// write adds rec's rows, in windows of about a page, cutting row groups
// between windows.
func (nw *nativeWriter) write(rec arrow.RecordBatch) error {
	n := int(rec.NumRows())
	if n == 0 {
		return nil
	}
	perRow := RecordBytes(rec)/int64(n) + 1
	window := max(1, min(n, int(int64(nw.pageSize)/perRow)))
	for lo := 0; lo < n; lo += window {
		hi := min(n, lo+window)
		for _, l := range nw.leaves {
			l.add(rec.Column(l.field), lo, hi)
			if l.pageBytes() >= nw.pageSize {
				nw.flushPage(l)
			}
		}
		nw.rgRows += hi - lo
		nw.rows += int64(hi - lo)
		if nw.rowGroupBytes() >= nw.rgMax {
			if err := nw.flushRowGroup(); err != nil {
				return err
			}
		}
	}
	return nil
}

func (nw *nativeWriter) rowGroupBytes() int64 {
	var n int64
	for _, l := range nw.leaves {
		n += int64(len(l.chunk) + len(l.vals) - l.gap)
	}
	return n
}

// size estimates the file's final size: bytes written plus the row group
// being filled (compressed pages, and the pages still open uncompressed).
func (nw *nativeWriter) size() int64 { return nw.w.n + nw.rowGroupBytes() }

func (l *leaf) pageBytes() int { return len(l.vals) - l.gap + len(l.rep.buf) + len(l.def.buf) }

// levelGap is the room kept before a list column's values for its page's
// levels: two or three runs per row, a few kilobytes a page.
const levelGap = 16 << 10

// Pages of at least probeBytes are encoded and compressed the way that
// suits their column, chosen on probe pages (a probe costs three or four
// encodings of the page: the interval between probes starts at probeEvery
// pages and doubles, up to probeMax, while the choice holds) among
//   - the zstd encoder (matches and entropy-coded literals: prompts
//     repeated across a group shrink 5x);
//   - zstd blocks of Huffman-coded literals only (their matches cost more
//     than they save on random token ids);
//   - for INT32 values, DELTA_BINARY_PACKED in raw-block frames: random
//     token ids below 2^18 take 19 bits instead of 32, a little less than
//     Huffman's codes, at several times the speed (BenchmarkPageModes);
//   - for byte arrays, DELTA_BYTE_ARRAY (front coding) then the zstd
//     encoder: a step's messages repeat its previous step's, and the
//     encoder is left only the new ones;
//   - raw-block frames when nothing saves 1/16 (logprobs: zstd saves
//     next to nothing).
//
// The fastest mode within 2% of the smallest wins. All pages are zstd
// frames: the column chunk's codec, and every reader, are the same.
const (
	probeBytes = 64 << 10
	probeEvery = 16
	probeMax   = 256
)

type pageMode uint8

const (
	modeZstd pageMode = iota
	modeLiterals
	modeStored
	modeDelta
	modeFront
)

// compressPage sets nw.zbuf to the page body (levels, then values from
// byte lv) encoded and compressed in l's mode, probing the modes when it
// is time. It returns the uncompressed size of the page and the encoding
// of its values.
func (nw *nativeWriter) compressPage(l *leaf, body []byte, lv int) (size int, encoding int32) {
	if len(body) < probeBytes {
		return nw.encodePage(modeZstd, body, lv)
	}
	cm := l.mode
	cm.mu.Lock()
	mode, probe := cm.mode, cm.left == 0
	if probe {
		cm.left = probeMax // until this probe sets it: one probe at a time
		cm.probes++
	} else {
		cm.left--
	}
	cm.mu.Unlock()
	if !probe {
		return nw.encodePage(mode, body, lv)
	}
	nw.zbuf = nw.zstd(nw.zbuf, body)
	nw.lbuf = appendLiteralsZstd(nw.lbuf[:0], body, &nw.huff)
	best := min(len(nw.zbuf), len(nw.lbuf))
	deltaSize, frontSize := -1, -1
	switch l.typ {
	case arrow.INT32:
		nw.dbuf = appendDeltaInt32(append(nw.dbuf[:0], body[:lv]...), body[lv:])
		deltaSize = storedZstdSize(len(nw.dbuf))
		best = min(best, deltaSize)
	case arrow.STRING, arrow.BINARY:
		nw.dbuf, nw.lens = appendDeltaByteArray(append(nw.dbuf[:0], body[:lv]...), body[lv:], nw.lens)
		nw.fbuf = nw.zstd(nw.fbuf, nw.dbuf)
		frontSize = len(nw.fbuf)
		best = min(best, frontSize)
	}
	within := func(n int) bool { return n >= 0 && n <= best+best/50 }
	switch {
	case best > len(body)-len(body)/16:
		mode = modeStored
	case within(deltaSize):
		mode = modeDelta
	case within(frontSize):
		mode = modeFront
	case within(len(nw.lbuf)):
		mode = modeLiterals
	default:
		mode = modeZstd
	}
	cm.mu.Lock()
	switch {
	case cm.every == 0 || mode != cm.mode:
		cm.every = probeEvery
	default:
		cm.every = min(2*cm.every, probeMax)
	}
	cm.mode, cm.left = mode, cm.every-1
	cm.mu.Unlock()
	switch mode {
	case modeZstd: // in zbuf
	case modeLiterals:
		nw.zbuf, nw.lbuf = nw.lbuf, nw.zbuf
	case modeDelta:
		nw.zbuf = appendStoredZstd(nw.zbuf[:0], nw.dbuf)
		return len(nw.dbuf), encodingDelta
	case modeFront:
		nw.zbuf, nw.fbuf = nw.fbuf, nw.zbuf
		return len(nw.dbuf), encodingFront
	default:
		return nw.encodePage(mode, body, lv)
	}
	return len(body), encodingPlain
}

// zstd compresses src with zstd's encoder into dst[:0], literals raw
// unless the writer is compact.
func (nw *nativeWriter) zstd(dst, src []byte) []byte {
	return nw.codec.encode(dst, src, nw.level, !nw.compact)
}

// encodePage sets nw.zbuf to the page body (levels, then values from
// byte lv) encoded and compressed in mode; it returns the uncompressed
// size and the encoding of the values.
func (nw *nativeWriter) encodePage(mode pageMode, body []byte, lv int) (size int, encoding int32) {
	switch mode {
	case modeStored:
		nw.zbuf = appendStoredZstd(nw.zbuf[:0], body)
	case modeLiterals:
		nw.zbuf = appendLiteralsZstd(nw.zbuf[:0], body, &nw.huff)
	case modeDelta:
		nw.dbuf = appendDeltaInt32(append(nw.dbuf[:0], body[:lv]...), body[lv:])
		nw.zbuf = appendStoredZstd(nw.zbuf[:0], nw.dbuf)
		return len(nw.dbuf), encodingDelta
	case modeFront:
		nw.dbuf, nw.lens = appendDeltaByteArray(append(nw.dbuf[:0], body[:lv]...), body[lv:], nw.lens)
		nw.zbuf = nw.zstd(nw.zbuf, nw.dbuf)
		return len(nw.dbuf), encodingFront
	default:
		nw.zbuf = nw.zstd(nw.zbuf, body)
	}
	return len(body), encodingPlain
}

// columnMode is how a column's pages are compressed, shared by every
// writer of the schema (default and compact writers apart) (shards of many partitions each write a few pages
// of a column: probing each shard's first pages would double their cost).
type columnMode struct {
	mu     sync.Mutex
	mode   pageMode
	left   int // pages before the modes are probed again
	every  int // pages between the last two probes
	probes int
}

// flushPage closes l's page: levels and values, compressed, appended with
// their header to the column chunk.
func (nw *nativeWriter) flushPage(l *leaf) {
	if l.levels == 0 {
		return
	}
	lv := nw.levels[:0]
	if l.maxRep > 0 {
		lv = l.rep.appendTo(lv)
	}
	if l.maxDef > 0 {
		lv = l.def.appendTo(lv)
	}
	nw.levels = lv
	// The page is levels then values; the values of a list column are
	// the bulk of it, so they wait behind a gap the levels usually fit
	// in, and the page is not copied whole.
	var body []byte
	if len(lv) <= l.gap {
		body = l.vals[l.gap-len(lv):]
		copy(body, lv)
	} else {
		body = append(append(nw.body[:0], lv...), l.vals[l.gap:]...)
		nw.body = body
	}
	size, enc := nw.compressPage(l, body, len(lv))
	nw.hdr = appendPageHeader(nw.hdr[:0], size, len(nw.zbuf), l.levels, enc)
	l.chunk = append(l.chunk, nw.hdr...)
	l.chunk = append(l.chunk, nw.zbuf...)
	l.uncompressed += int64(len(nw.hdr) + size)
	l.chunkLevels += int64(l.levels)
	l.pages[enc]++
	l.vals, l.nbits, l.levels = l.vals[:l.gap], 0, 0
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// encodingStats counts the chunk's pages by the encoding of their values.
func (l *leaf) encodingStats() metadata.EncodingStats {
	st := map[pq.Encoding]int32{}
	for enc, n := range l.pages {
		if n > 0 {
			st[pq.Encoding(enc)] = n
		}
	}
	return metadata.EncodingStats{DataEncodingStats: st}
}

// flushRowGroup writes the buffered column chunks and their metadata.
func (nw *nativeWriter) flushRowGroup() error {
	if nw.rgRows == 0 {
		return nil
	}
	rg := nw.meta.AppendRowGroup()
	for _, l := range nw.leaves {
		nw.flushPage(l)
		offset := nw.w.n
		if _, err := nw.w.Write(l.chunk); err != nil {
			return fmt.Errorf("parquet: write: %w", err)
		}
		cc := rg.NextColumnChunk()
		if l.stats != nil {
			e := l.stats.encode(l.typ, l.signed)
			e.ApplyStatSizeLimits(int(nw.maxStats)) // as pqarrow: no min/max over 4 KiB
			cc.SetStats(e)
			l.stats.reset()
		}
		err := cc.Finish(metadata.ChunkMetaInfo{
			NumValues:        l.chunkLevels,
			DictPageOffset:   -1,
			IndexPageOffset:  -1,
			DataPageOffset:   offset,
			CompressedSize:   int64(len(l.chunk)),
			UncompressedSize: l.uncompressed,
		}, false, false, l.encodingStats())
		if err != nil {
			return fmt.Errorf("parquet: column chunk %s: %w", l.path, err)
		}
		if l.pages[encodingDelta]+l.pages[encodingFront] > 0 {
			// Finish lists the writer properties' encoding (PLAIN) and RLE
			// for the levels; the chunk's encodings are those of its pages.
			md := cc.Contents().MetaData
			md.Encodings = md.Encodings[:0]
			if l.pages[encodingPlain] > 0 {
				md.Encodings = append(md.Encodings, encodingPlain)
			}
			if l.pages[encodingDelta] > 0 {
				md.Encodings = append(md.Encodings, encodingDelta)
			}
			if l.pages[encodingFront] > 0 {
				md.Encodings = append(md.Encodings, encodingFront)
			}
			md.Encodings = append(md.Encodings, encodingRLE)
			// Finish lists the stats in map order: sorted, the same
			// input makes the same file.
			sort.Slice(md.EncodingStats, func(i, j int) bool { return md.EncodingStats[i].Encoding < md.EncodingStats[j].Encoding })
		}
		l.chunk, l.chunkLevels, l.uncompressed, l.pages = l.chunk[:0], 0, 0, [len(l.pages)]int32{}
	}
	rg.SetNumRows(nw.rgRows)
	if err := rg.Finish(0, nw.rgs); err != nil {
		return fmt.Errorf("parquet: row group: %w", err)
	}
	nw.rgs++
	nw.rgRows = 0
	return nil
}

func (nw *nativeWriter) addMetadata(k, v string) error {
	return nw.meta.AppendKeyValueMetadata(k, v)
}

// close writes the last row group and the footer.
func (nw *nativeWriter) close() error {
	if err := nw.flushRowGroup(); err != nil {
		return err
	}
	md, err := nw.meta.Finish()
	if err != nil {
		return fmt.Errorf("parquet: footer: %w", err)
	}
	n, err := md.WriteTo(nw.w, nil)
	if err != nil {
		return fmt.Errorf("parquet: footer: %w", err)
	}
	tail := binary.LittleEndian.AppendUint32(nil, uint32(n))
	if _, err := nw.w.Write(append(tail, "PAR1"...)); err != nil {
		return fmt.Errorf("parquet: footer: %w", err)
	}
	select {
	case nw.info.bufs <- nw.give():
	default: // enough kept
	}
	return nil
}

// writerBufs are a closed writer's buffers, kept for the next writer of
// the schema: shards open and close all run long, and each would grow its
// page and column-chunk buffers from nothing again.
type writerBufs struct {
	vals, chunk                                     [][]byte // per leaf
	body, zbuf, lbuf, dbuf, fbuf, lens, levels, hdr []byte
}

func (nw *nativeWriter) give() *writerBufs {
	b := &writerBufs{body: nw.body, zbuf: nw.zbuf, lbuf: nw.lbuf, dbuf: nw.dbuf, fbuf: nw.fbuf, lens: nw.lens, levels: nw.levels, hdr: nw.hdr}
	for _, l := range nw.leaves {
		b.vals, b.chunk = append(b.vals, l.vals), append(b.chunk, l.chunk)
		l.vals, l.chunk = nil, nil
	}
	nw.body, nw.zbuf, nw.lbuf, nw.dbuf, nw.fbuf, nw.lens, nw.levels, nw.hdr = nil, nil, nil, nil, nil, nil, nil, nil
	return b
}

func (nw *nativeWriter) take(b *writerBufs) {
	nw.body, nw.zbuf, nw.lbuf, nw.levels, nw.hdr = b.body[:0], b.zbuf[:0], b.lbuf[:0], b.levels[:0], b.hdr[:0]
	nw.dbuf, nw.fbuf, nw.lens = b.dbuf[:0], b.fbuf[:0], b.lens[:0]
	for i, l := range nw.leaves {
		if cap(b.vals[i]) >= l.gap {
			l.vals = b.vals[i][:l.gap]
		}
		l.chunk = b.chunk[i][:0]
	}
}

// add appends rows [lo, hi) of col to l's page.
func (l *leaf) add(col arrow.Array, lo, hi int) {
	switch l.shape {
	case shapeFlat:
		l.addFlat(col, lo, hi)
	case shapeList:
		lst := col.(*array.List)
		l.addNested(lst, lst.ListValues(), nil, lo, hi)
	case shapeMapKey:
		m := col.(*array.Map)
		l.addNested(m.List, m.Keys(), nil, lo, hi)
	case shapeMapValue:
		m := col.(*array.Map)
		l.addNested(m.List, m.Items(), m.Items(), lo, hi)
	}
}

// addFlat: definition level maxDef for a value, maxDef-1 for a null; no
// repetition levels.
func (l *leaf) addFlat(col arrow.Array, lo, hi int) {
	l.levels += hi - lo
	if l.maxDef == 0 || col.NullN() == 0 {
		l.def.put(l.maxDef, hi-lo)
		l.addValues(col, lo, hi)
		return
	}
	for i := lo; i < hi; {
		j := i + 1
		valid := col.IsValid(i)
		for j < hi && col.IsValid(j) == valid {
			j++
		}
		if valid {
			l.def.put(l.maxDef, j-i)
			l.addValues(col, i, j)
		} else {
			l.def.put(l.maxDef-1, j-i)
			if l.stats != nil {
				l.stats.nulls += int64(j - i)
			}
		}
		i = j
	}
}

// addNested writes rows [lo, hi) of a list (or a map's keys or values,
// whose entries are the list's elements): per row a null (definition 0),
// an empty list (the list's own level) or one entry per element
// (repetition 0 for the first, 1 for the rest). items, when set, are
// nullable entries one level deeper.
func (l *leaf) addNested(lst *array.List, values, items arrow.Array, lo, hi int) {
	if items != nil && (items.NullN() == 0 || l.maxDef != l.listLevel()+2) {
		items = nil // no null entries to mark
	}
	nullLists := l.nullable && lst.NullN() > 0
	runStart, runEnd := int64(-1), int64(0) // elements of consecutive rows, written at once
	flush := func() {
		if runStart >= 0 {
			l.addElems(values, items, runStart, runEnd)
			runStart = -1
		}
	}
	for i := lo; i < hi; i++ {
		if nullLists && lst.IsNull(i) {
			flush()
			l.rep.put(0, 1)
			l.def.put(0, 1)
			l.levels++
			continue
		}
		s, e := lst.ValueOffsets(i)
		if s == e {
			flush()
			l.rep.put(0, 1)
			l.def.put(l.listLevel(), 1)
			l.levels++
			continue
		}
		l.rep.put(0, 1)
		l.rep.put(1, int(e-s)-1)
		l.levels += int(e - s)
		if runStart >= 0 && s != runEnd {
			flush()
		}
		if runStart < 0 {
			runStart = s
		}
		runEnd = e
	}
	flush()
}

// listLevel is the definition level of an empty (present) list.
func (l *leaf) listLevel() int16 {
	if l.nullable {
		return 1
	}
	return 0
}

// addElems writes elements [s, e) of values: definition maxDef for each,
// one less for a null item when items is set.
func (l *leaf) addElems(values, items arrow.Array, s, e int64) {
	if items == nil {
		l.def.put(l.maxDef, int(e-s))
		l.addValues(values, int(s), int(e))
		return
	}
	for i := s; i < e; {
		j := i + 1
		valid := items.IsValid(int(i))
		for j < e && items.IsValid(int(j)) == valid {
			j++
		}
		if valid {
			l.def.put(l.maxDef, int(j-i))
			l.addValues(values, int(i), int(j))
		} else {
			l.def.put(l.maxDef-1, int(j-i))
		}
		i = j
	}
}

// addValues appends the PLAIN bytes of values [lo, hi) of col (all
// valid), updating the statistics.
func (l *leaf) addValues(col arrow.Array, lo, hi int) {
	if hi <= lo {
		return
	}
	switch a := col.(type) {
	case *array.Int32:
		addFixed(l, a.Int32Values()[lo:hi], func(x int32) { l.stats.int(int64(x)) })
	case *array.Int64:
		addFixed(l, a.Int64Values()[lo:hi], l.stats.int)
	case *array.Timestamp:
		v := a.TimestampValues()[lo:hi]
		addFixed(l, unsafe.Slice((*int64)(unsafe.Pointer(unsafe.SliceData(v))), len(v)), l.stats.int)
	case *array.Float32:
		addFixed(l, a.Float32Values()[lo:hi], func(x float32) { l.stats.float(float64(x)) })
	case *array.Float64:
		addFixed(l, a.Float64Values()[lo:hi], l.stats.float)
	case *array.Boolean:
		for i := lo; i < hi; i++ {
			b := a.Value(i)
			if l.nbits%8 == 0 {
				l.vals = append(l.vals, 0)
			}
			if b {
				l.vals[len(l.vals)-1] |= 1 << (l.nbits % 8)
			}
			l.nbits++
			if l.stats != nil {
				l.stats.bool(b)
			}
		}
	case *array.String:
		for i := lo; i < hi; i++ {
			l.addBytes(a.Value(i))
		}
	case *array.Binary:
		for i := lo; i < hi; i++ {
			l.addBytes(unsafe.String(unsafe.SliceData(a.Value(i)), len(a.Value(i))))
		}
	default:
		panic(fmt.Sprintf("parquet: native writer got %T", col)) // nativeField admits no other type
	}
}

// addBytes appends a BYTE_ARRAY value: its length, then its bytes.
func (l *leaf) addBytes(s string) {
	l.vals = binary.LittleEndian.AppendUint32(l.vals, uint32(len(s)))
	l.vals = append(l.vals, s...)
	if l.stats != nil {
		l.stats.bytes(s)
	}
}

// addFixed appends fixed-width values and, if l keeps statistics, passes
// each to stat.
func addFixed[T int32 | int64 | float32 | float64](l *leaf, v []T, stat func(T)) {
	l.vals = appendPlain(l.vals, v)
	if l.stats != nil {
		for _, x := range v {
			stat(x)
		}
	}
}

// stats are a column chunk's min, max and null count, encoded as Parquet
// stores them (PLAIN values; strings compared as unsigned bytes).
type stats struct {
	has        bool
	imin, imax int64
	fmin, fmax float64
	bmin, bmax []byte
	nulls      int64
}

func (s *stats) reset() { *s = stats{bmin: s.bmin[:0], bmax: s.bmax[:0]} }

func (s *stats) int(x int64) {
	if !s.has {
		s.imin, s.imax, s.has = x, x, true
		return
	}
	s.imin, s.imax = min(s.imin, x), max(s.imax, x)
}

func (s *stats) bool(b bool) {
	x := int64(0)
	if b {
		x = 1
	}
	s.int(x)
}

// float ignores NaN; a zero minimum is -0 and a zero maximum +0, as the
// format asks.
func (s *stats) float(x float64) {
	if math.IsNaN(x) {
		return
	}
	if !s.has {
		s.fmin, s.fmax, s.has = x, x, true
	} else {
		if x < s.fmin {
			s.fmin = x
		}
		if x > s.fmax {
			s.fmax = x
		}
	}
	if s.fmin == 0 {
		s.fmin = math.Copysign(0, -1)
	}
	if s.fmax == 0 {
		s.fmax = 0
	}
}

func (s *stats) bytes(v string) {
	if !s.has {
		s.bmin, s.bmax, s.has = append(s.bmin[:0], v...), append(s.bmax[:0], v...), true
		return
	}
	if v < string(s.bmin) {
		s.bmin = append(s.bmin[:0], v...)
	} else if v > string(s.bmax) {
		s.bmax = append(s.bmax[:0], v...)
	}
}

// encode gives the statistics as the footer stores them; signed is the
// column's sort order (SIGNED also fills the legacy min/max fields).
func (s *stats) encode(t arrow.Type, signed bool) metadata.EncodedStatistics {
	e := metadata.EncodedStatistics{HasNullCount: true, NullCount: s.nulls, Signed: signed}
	if !s.has {
		return e
	}
	var lo, hi []byte
	switch t {
	case arrow.INT32:
		lo = binary.LittleEndian.AppendUint32(nil, uint32(s.imin))
		hi = binary.LittleEndian.AppendUint32(nil, uint32(s.imax))
	case arrow.INT64, arrow.TIMESTAMP:
		lo = binary.LittleEndian.AppendUint64(nil, uint64(s.imin))
		hi = binary.LittleEndian.AppendUint64(nil, uint64(s.imax))
	case arrow.BOOL:
		lo, hi = []byte{byte(s.imin)}, []byte{byte(s.imax)}
	case arrow.FLOAT32:
		lo = binary.LittleEndian.AppendUint32(nil, math.Float32bits(float32(s.fmin)))
		hi = binary.LittleEndian.AppendUint32(nil, math.Float32bits(float32(s.fmax)))
	case arrow.FLOAT64:
		lo = binary.LittleEndian.AppendUint64(nil, math.Float64bits(s.fmin))
		hi = binary.LittleEndian.AppendUint64(nil, math.Float64bits(s.fmax))
	case arrow.STRING, arrow.BINARY:
		lo, hi = bytes.Clone(s.bmin), bytes.Clone(s.bmax)
	default:
		return e
	}
	e.HasMin, e.Min, e.HasMax, e.Max = true, lo, true, hi
	return e
}
