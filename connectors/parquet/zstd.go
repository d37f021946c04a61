package parquet

import (
	"encoding/binary"
	"runtime"
	"sync"

	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/klauspost/compress/zstd"
)

// The zstd codec that arrow-go registers forces entropy coding of every
// literal block, which costs a third of the compression time on token
// data for a size gain under 1% (measured on generated traces, see the
// README). fastZstd is the same format from the same library with the
// encoder's own choice; decoding and streaming are arrow-go's.
type fastZstd struct {
	compress.Codec
	pools sync.Map // zstd.EncoderLevel → encoderPool
}

// Encoders use a 1 MiB window (pages are about that size; a smaller
// history to allocate and to keep) and no content checksum (pages are
// decoded whole and Parquet readers do not ask for one; xxhash was 2% of
// ingest).
//
// encoderPool keeps idle encoders of one level. Not a sync.Pool: that one
// is emptied at every garbage collection, and a new encoder allocates its
// tables and history again (megabytes) — churn the GC then has to collect.
type encoderPool chan *zstd.Encoder

func init() {
	def, err := compress.GetCodec(compress.Codecs.Zstd)
	if err != nil {
		return // arrow-go without zstd: nothing to improve
	}
	compress.RegisterCodec(compress.Codecs.Zstd, &fastZstd{Codec: def})
}

func (z *fastZstd) encoder(level zstd.EncoderLevel) (*zstd.Encoder, encoderPool) {
	p, _ := z.pools.LoadOrStore(level, make(encoderPool, 2*runtime.GOMAXPROCS(0)+2))
	pool := p.(encoderPool)
	select {
	case enc := <-pool:
		return enc, pool
	default:
		enc, _ := zstd.NewWriter(nil, zstd.WithZeroFrames(true), zstd.WithEncoderLevel(level), zstd.WithEncoderConcurrency(1),
			zstd.WithWindowSize(1<<20), zstd.WithEncoderCRC(false))
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
	lvl := zstd.SpeedDefault
	if level != compress.DefaultCompressionLevel {
		lvl = zstd.EncoderLevelFromZstd(level)
	}
	enc, pool := z.encoder(lvl)
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

// appendStoredZstd appends src as a zstd frame of raw (stored) blocks
// (RFC 8878): any zstd decoder reads it, and writing it is a copy.
func appendStoredZstd(dst, src []byte) []byte {
	const maxBlock = 128 << 10
	// Magic number; frame header: single segment, 4-byte content size, no
	// checksum, no dictionary.
	dst = append(dst, 0x28, 0xB5, 0x2F, 0xFD, 0xA0)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(src)))
	for {
		n := min(len(src), maxBlock)
		h := uint32(n) << 3 // block type 0: raw
		if n == len(src) {
			h |= 1 // last block
		}
		dst = append(dst, byte(h), byte(h>>8), byte(h>>16))
		dst = append(dst, src[:n]...)
		src = src[n:]
		if len(src) == 0 {
			return dst
		}
	}
}
