package parquet

import (
	"encoding/binary"
	"math"
	"math/bits"
	"slices"
	"unsafe"
)

// This file holds the byte-level pieces of the native encoder: levels in
// the RLE/bit-packed hybrid (RLE runs only), data page headers in Thrift's
// compact protocol, and PLAIN values.

// levelRuns encodes repetition or definition levels as RLE runs. Levels
// arrive in runs (a list's elements share one level, a column without
// nulls is one run), so a run-only encoding is both the cheapest to write
// and close to the smallest; it is valid RLE/bit-packed hybrid data.
type levelRuns struct {
	buf   []byte
	cur   int16
	run   int
	width int // bytes per run value: ceil(bit width / 8)
}

func newLevelRuns(maxLevel int16) levelRuns {
	return levelRuns{width: (bits.Len16(uint16(maxLevel)) + 7) / 8}
}

// put appends n copies of level.
func (r *levelRuns) put(level int16, n int) {
	if n <= 0 {
		return
	}
	if r.run > 0 && level == r.cur {
		r.run += n
		return
	}
	r.flush()
	r.cur, r.run = level, n
}

func (r *levelRuns) flush() {
	if r.run == 0 {
		return
	}
	r.buf = binary.AppendUvarint(r.buf, uint64(r.run)<<1)
	for i := 0; i < r.width; i++ {
		r.buf = append(r.buf, byte(r.cur>>(8*i)))
	}
	r.run = 0
}

// appendTo appends the levels the way a v1 data page carries them: a
// 4-byte little-endian length, then the runs. It resets r.
func (r *levelRuns) appendTo(dst []byte) []byte {
	r.flush()
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(r.buf)))
	dst = append(dst, r.buf...)
	r.buf = r.buf[:0]
	return dst
}

// Parquet enum values written in page headers.
const (
	pageTypeData     = 0
	encodingPlain    = 0
	encodingRLE      = 3
	encodingDelta    = 5 // DELTA_BINARY_PACKED
	encodingFront    = 7 // DELTA_BYTE_ARRAY
	thriftI32        = 5
	thriftStruct     = 12
	thriftFieldDelta = 1
)

// appendPageHeader appends a Thrift compact-protocol PageHeader of a v1
// data page: type, sizes, then DataPageHeader{num_values, encoding of the
// values, definition and repetition level encodings (RLE)}.
func appendPageHeader(dst []byte, uncompressed, compressed, numValues int, encoding int32) []byte {
	i32 := func(dst []byte, v int32) []byte {
		dst = append(dst, thriftFieldDelta<<4|thriftI32)
		return binary.AppendUvarint(dst, uint64(uint32((v<<1)^(v>>31)))) // zigzag
	}
	dst = i32(dst, pageTypeData)         // 1: type
	dst = i32(dst, int32(uncompressed))  // 2: uncompressed_page_size
	dst = i32(dst, int32(compressed))    // 3: compressed_page_size
	dst = append(dst, 2<<4|thriftStruct) // 5: data_page_header (skips 4: crc)
	dst = i32(dst, int32(numValues))     // 1: num_values
	dst = i32(dst, encoding)             // 2: encoding
	dst = i32(dst, encodingRLE)          // 3: definition_level_encoding
	dst = i32(dst, encodingRLE)          // 4: repetition_level_encoding
	dst = append(dst, 0)                 // end of DataPageHeader
	return append(dst, 0)                // end of PageHeader
}

// littleEndian reports whether the machine stores integers little endian,
// the byte order of Parquet's PLAIN encoding: then value slices are copied
// as they are.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// appendPlain appends values in PLAIN encoding: little-endian, copied as
// they lie on a little-endian machine.
func appendPlain[T int32 | int64 | float32 | float64](dst []byte, v []T) []byte {
	if len(v) == 0 {
		return dst
	}
	if littleEndian {
		return append(dst, unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), int(unsafe.Sizeof(v[0]))*len(v))...)
	}
	for _, x := range v {
		switch x := any(x).(type) {
		case int32:
			dst = binary.LittleEndian.AppendUint32(dst, uint32(x))
		case int64:
			dst = binary.LittleEndian.AppendUint64(dst, uint64(x))
		case float32:
			dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(x))
		case float64:
			dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(x))
		}
	}
	return dst
}

// Blocks of DELTA_BINARY_PACKED values: 128 deltas in 4 miniblocks of 32,
// each miniblock bit-packed at its own width.
const (
	deltaBlock      = 128
	deltaMiniblocks = 4
	deltaMini       = deltaBlock / deltaMiniblocks
)

// appendDeltaInt32 appends the int32 values of src (PLAIN: 4 bytes each,
// little endian) in DELTA_BINARY_PACKED encoding: a header (block size,
// miniblocks per block, value count, first value), then per block of 128
// deltas between consecutive values the smallest delta, the bit width of
// each miniblock, and the miniblocks of deltas less the smallest,
// bit-packed from the least significant bit. Arithmetic wraps at 32 bits,
// as readers of INT32 columns undo it. A last partial miniblock is padded
// with zeros; miniblocks past the last value have width 0 and no bytes.
func appendDeltaInt32(dst, src []byte) []byte {
	n := len(src) / 4
	dst = binary.AppendUvarint(dst, deltaBlock)
	dst = binary.AppendUvarint(dst, deltaMiniblocks)
	dst = binary.AppendUvarint(dst, uint64(n))
	var prev int32
	if n > 0 {
		prev = int32(binary.LittleEndian.Uint32(src))
	}
	dst = binary.AppendVarint(dst, int64(prev)) // zigzag
	var deltas [deltaBlock]uint32
	for i := 1; i < n; {
		m := min(deltaBlock, n-i)
		minDelta := int32(math.MaxInt32)
		for k, b := 0, src[4*i:4*(i+m)]; k < m; k++ {
			v := int32(binary.LittleEndian.Uint32(b[4*k:]))
			d := v - prev
			prev = v
			deltas[k] = uint32(d)
			minDelta = min(minDelta, d)
		}
		clear(deltas[m:]) // the padding of a last miniblock
		dst = binary.AppendVarint(dst, int64(minDelta))
		var widths [deltaMiniblocks]int
		for mb := range widths {
			if mb*deltaMini >= m {
				break // unused: width 0, no bytes
			}
			var or uint32
			for k := mb * deltaMini; k < (mb+1)*deltaMini; k++ {
				if k < m {
					deltas[k] -= uint32(minDelta)
				}
				or |= deltas[k]
			}
			widths[mb] = bits.Len32(or)
		}
		for _, w := range widths {
			dst = append(dst, byte(w))
		}
		for mb, w := range widths {
			if mb*deltaMini >= m {
				break
			}
			// 32 values of w bits are w whole 32-bit words.
			var acc uint64
			nb := 0
			for _, d := range deltas[mb*deltaMini : (mb+1)*deltaMini] {
				acc |= uint64(d) << nb
				nb += w
				if nb >= 32 {
					dst = binary.LittleEndian.AppendUint32(dst, uint32(acc))
					acc >>= 32
					nb -= 32
				}
			}
		}
		i += m
	}
	return dst
}

// appendDeltaByteArray appends the byte arrays of src (PLAIN: a 4-byte
// little-endian length, then the bytes, each) in DELTA_BYTE_ARRAY
// encoding, front coding: the length of the prefix each value shares with
// the one before (DELTA_BINARY_PACKED), then the rest of each value in
// DELTA_LENGTH_BYTE_ARRAY (the lengths, DELTA_BINARY_PACKED, then the
// bytes). A conversation's messages repeat those of its previous step
// whole: only the new ones are left to compress. lens is scratch space,
// returned for reuse.
func appendDeltaByteArray(dst, src, lens []byte) (out, scratch []byte) {
	// lens holds the prefix lengths, then the suffix lengths, PLAIN.
	n := 0
	for p := 0; p+4 <= len(src); n++ {
		p += 4 + int(binary.LittleEndian.Uint32(src[p:]))
	}
	lens = slices.Grow(lens[:0], 8*n)[:8*n]
	var prev []byte
	for i, p := 0, 0; i < n; i++ {
		l := int(binary.LittleEndian.Uint32(src[p:]))
		v := src[p+4 : p+4+l]
		pre := commonPrefix(prev, v)
		binary.LittleEndian.PutUint32(lens[4*i:], uint32(pre))
		binary.LittleEndian.PutUint32(lens[4*(n+i):], uint32(l-pre))
		prev, p = v, p+4+l
	}
	dst = appendDeltaInt32(dst, lens[:4*n])
	dst = appendDeltaInt32(dst, lens[4*n:])
	for i, p := 0, 0; i < n; i++ {
		l := int(binary.LittleEndian.Uint32(src[p:]))
		pre := int(binary.LittleEndian.Uint32(lens[4*i:]))
		dst = append(dst, src[p+4+pre:p+4+l]...)
		p += 4 + l
	}
	return dst, lens
}

// commonPrefix is the length of the longest common prefix of a and b,
// compared eight bytes at a time.
func commonPrefix(a, b []byte) int {
	n := min(len(a), len(b))
	i := 0
	for ; i+8 <= n; i += 8 {
		if x := binary.LittleEndian.Uint64(a[i:]) ^ binary.LittleEndian.Uint64(b[i:]); x != 0 {
			return i + bits.TrailingZeros64(x)>>3
		}
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}
