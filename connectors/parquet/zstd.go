package parquet

import (
	"encoding/binary"
	"runtime"
	"sync"

	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/klauspost/compress/huff0"
	"github.com/klauspost/compress/zstd"
)

// The zstd codec that arrow-go registers forces entropy coding of every
// literal block, which costs much of the compression time on token data
// for little size (BenchmarkPageModes; docs/performance.md#choices-behind-the-defaults). fastZstd is the
// same format from the same library with the encoder's own choice;
// decoding and streaming are arrow-go's.
type fastZstd struct {
	compress.Codec
	pools sync.Map // encoderKind → encoderPool
}

// encoderKind is a level and whether literals are left raw.
type encoderKind struct {
	level      zstd.EncoderLevel
	rawLiteral bool
}

// Encoders use a 1 MiB window (pages are about that size; a smaller
// history to allocate and to keep) and no content checksum (pages are
// decoded whole and Parquet readers do not ask for one, and xxhash is
// not free).
//
// encoderPool keeps idle encoders of one level. Not a sync.Pool: that one
// is emptied at every garbage collection, and a new encoder allocates its
// tables and history again (megabytes) — churn the GC then has to collect.
type encoderPool chan *zstd.Encoder

// pageCodec is the native page writer's zstd codec, built on arrow-go's.
// It is passed explicitly, never registered: arrow-go's process-wide codec
// stays its own for the pqarrow path (Options.Reference) and for readers.
var pageCodec = sync.OnceValues(func() (*fastZstd, error) {
	def, err := compress.GetCodec(compress.Codecs.Zstd)
	if err != nil {
		return nil, err
	}
	return &fastZstd{Codec: def}, nil
})

func (z *fastZstd) encoder(kind encoderKind) (*zstd.Encoder, encoderPool) {
	p, _ := z.pools.LoadOrStore(kind, make(encoderPool, 2*runtime.GOMAXPROCS(0)+2))
	pool := p.(encoderPool)
	select {
	case enc := <-pool:
		return enc, pool
	default:
		enc, _ := zstd.NewWriter(nil, zstd.WithZeroFrames(true), zstd.WithEncoderLevel(kind.level), zstd.WithEncoderConcurrency(1),
			zstd.WithWindowSize(1<<20), zstd.WithEncoderCRC(false), zstd.WithNoEntropyCompression(kind.rawLiteral))
		return enc, pool
	}
}

func (p encoderPool) put(enc *zstd.Encoder) {
	select {
	case p <- enc:
	default: // enough idle ones
	}
}

// Encode compresses src at the default level.
func (z *fastZstd) Encode(dst, src []byte) []byte {
	return z.EncodeLevel(dst, src, compress.DefaultCompressionLevel)
}

// EncodeLevel compresses src at a zstd level (1 fastest).
func (z *fastZstd) EncodeLevel(dst, src []byte, level int) []byte {
	return z.encode(dst, src, level, false)
}

// encode compresses src at a zstd level, with literals entropy-coded or
// left raw (Options.Compact).
func (z *fastZstd) encode(dst, src []byte, level int, rawLiterals bool) []byte {
	lvl := zstd.SpeedDefault
	if level != compress.DefaultCompressionLevel {
		lvl = zstd.EncoderLevelFromZstd(level)
	}
	enc, pool := z.encoder(encoderKind{lvl, rawLiterals})
	defer pool.put(enc)
	return enc.EncodeAll(src, dst[:0])
}

// DecodeWithError keeps arrow-go's error-returning decoder.
func (z *fastZstd) DecodeWithError(dst, src []byte) ([]byte, error) {
	if ec, ok := z.Codec.(compress.ErrorCodec); ok {
		return ec.DecodeWithError(dst, src)
	}
	return compress.Decode(z.Codec, dst, src)
}

// zstd frames written by hand (RFC 8878): a header of one segment with
// a 4-byte content size, no checksum, no dictionary; then blocks of at
// most 128 KiB.
const maxBlock = 128 << 10

func appendFrameHeader(dst []byte, size int) []byte {
	dst = append(dst, 0x28, 0xB5, 0x2F, 0xFD, 0xA0)
	return binary.LittleEndian.AppendUint32(dst, uint32(size))
}

// appendBlockHeader appends a block header: last block flag, type (0 raw,
// 2 compressed), size.
func appendBlockHeader(dst []byte, last bool, typ, size int) []byte {
	h := uint32(size)<<3 | uint32(typ)<<1
	if last {
		h |= 1
	}
	return append(dst, byte(h), byte(h>>8), byte(h>>16))
}

// storedZstdSize is the size of appendStoredZstd's frame of n bytes.
func storedZstdSize(n int) int {
	return 9 + 3*max(1, (n+maxBlock-1)/maxBlock) + n
}

// appendStoredZstd appends src as a zstd frame of raw (stored) blocks:
// any zstd decoder reads it, and writing it is a copy.
func appendStoredZstd(dst, src []byte) []byte {
	dst = appendFrameHeader(dst, len(src))
	for {
		n := min(len(src), maxBlock)
		dst = appendBlockHeader(dst, n == len(src), 0, n)
		dst = append(dst, src[:n]...)
		src = src[n:]
		if len(src) == 0 {
			return dst
		}
	}
}

// appendLiteralsZstd appends src as a zstd frame whose blocks hold only
// Huffman-coded literals (four streams) and no sequences: zstd's entropy
// stage without its match search. A block Huffman does not shrink is
// stored raw.
func appendLiteralsZstd(dst, src []byte, s *huff0.Scratch) []byte {
	dst = appendFrameHeader(dst, len(src))
	s.Reuse = huff0.ReusePolicyNone
	for {
		n := min(len(src), maxBlock)
		last := n == len(src)
		var out []byte
		if n >= 1024 {
			out, _, _ = huff0.Compress4X(src[:n], s) // an error (incompressible, one symbol) leaves out nil
		}
		if out != nil && len(out)+6 < n {
			// Literals section header, 18-bit sizes: type 2 (Huffman),
			// size format 3 (four streams), regenerated and compressed
			// sizes; then the Huffman table and streams; then a sequences
			// section of 0 sequences.
			h := uint64(2) | 3<<2 | uint64(n)<<4 | uint64(len(out))<<22
			dst = appendBlockHeader(dst, last, 2, 5+len(out)+1)
			dst = append(dst, byte(h), byte(h>>8), byte(h>>16), byte(h>>24), byte(h>>32))
			dst = append(dst, out...)
			dst = append(dst, 0)
		} else {
			dst = appendBlockHeader(dst, last, 0, n)
			dst = append(dst, src[:n]...)
		}
		src = src[n:]
		if len(src) == 0 {
			return dst
		}
	}
}
