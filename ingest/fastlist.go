package ingest

import (
	"encoding/binary"
	"math"
	"math/bits"
	"unsafe"
)

// Fast paths for the two lists that make up most of every record: token
// ids and logprobs. They accept the common spelling only (plain integers;
// decimals with an optional exponent) and report false on anything else,
// leaving the cursor where it was, so the general path re-reads the list
// and produces exactly its results and errors. Tested against the general
// path (TestFastListsAgree, FuzzFastLists).

// fastLists switches the fast paths on; tests switch them off to compare.
var fastLists = true

// isWS reports JSON whitespace.
func isWS(c byte) bool { return c == ' ' || c == '\n' || c == '\t' || c == '\r' }

// fastInts appends the token ids of the array at the cursor to dst. ok is
// false (cursor unchanged) unless every element is a plain integer in
// [0, MaxInt32] written without sign, fraction or exponent.
func (l *lexer) fastInts(dst []int32) (out []int32, ok bool) {
	b := l.buf
	i := l.pos
	if i >= len(b) || b[i] != '[' {
		return dst, false
	}
	i++
	for i < len(b) && isWS(b[i]) {
		i++
	}
	if i < len(b) && b[i] == ']' {
		l.pos = i + 1
		return dst, true
	}
	if blockInts && i < len(b) && b[i]-'0' <= 9 {
		var done bool
		if dst, i, done = intBlocks(b, i, dst); done {
			l.pos = i
			return dst, true
		}
		// i is where an element (or the blank before one) starts: the
		// loop below goes on from there.
	}
	for i < len(b) {
		var v uint64
		if i+8 <= len(b) {
			// Up to seven digits at once (SWAR): the digit run's length from
			// a mask of the bytes that are not digits, then the digits
			// combined pairwise.
			d := binary.LittleEndian.Uint64(b[i:]) - 0x3030303030303030
			notDigit := (d | (d + 0x7676767676767676)) & 0x8080808080808080
			n := bits.TrailingZeros64(notDigit) >> 3
			if n == 0 {
				if isWS(b[i]) { // after a comma
					i++
					continue
				}
				return dst, false // a sign, a string, ...: the general path decides
			}
			if n < 8 {
				if n > 1 && b[i] == '0' {
					return dst, false // 012
				}
				// The byte after the digits is in the word already: a comma
				// moves on without loading it again (the loop's critical
				// path is the cursor).
				sep := byte(d >> (8 * uint(n))) // no borrow: the bytes below are digits
				v = d << (64 - 8*uint(n))
				v = (v*10 + v>>8) & 0x00FF00FF00FF00FF
				v = (v*100 + v>>16) & 0x0000FFFF0000FFFF
				v = (v*10000 + v>>32) & 0xFFFFFFFF
				if sep == ','+0x100-'0' {
					dst = append(dst, int32(v))
					i += n + 1
					continue
				}
				i += n
				goto end
			}
		}
		{
			d := b[i] - '0'
			if d > 9 {
				return dst, false
			}
			i++
			v = uint64(d)
			if d == 0 {
				goto end
			}
			for n := 1; i < len(b); n++ {
				d := b[i] - '0'
				if d > 9 {
					break
				}
				if n == 10 {
					return dst, false // more than 10 digits
				}
				v = v*10 + uint64(d)
				i++
			}
			if v > math.MaxInt32 {
				return dst, false
			}
		}
	end:
		if i >= len(b) {
			return dst, false
		}
		c := b[i]
		if isWS(c) {
			for i < len(b) && isWS(b[i]) {
				i++
			}
			if i >= len(b) {
				return dst, false
			}
			c = b[i]
		}
		switch c {
		case ',':
			dst = append(dst, int32(v))
			i++
			for i < len(b) && isWS(b[i]) {
				i++
			}
		case ']':
			l.pos = i + 1
			return append(dst, int32(v)), true
		default:
			return dst, false // 3.0, 1e3, 012: the general path's call
		}
	}
	return dst, false
}

// blockInts switches intBlocks on; the benchmark turns it off to compare.
var blockInts = true

// intBlocks parses the token ids of a list from i, the first digit of its
// first element, 64 bytes at a time: the bytes that are not digits are
// found for the whole block at once (a bit mask), and each number is then
// read from the word at its start, so that the numbers of a block are
// parsed independently of one another instead of one after the other
// along the cursor. It takes integers of 1 to 8 digits without a leading
// zero, separated by a comma and optionally spaces (", " as Python
// writes). On anything else, or near the end of b, it stops where the
// element it could not take starts (next) and reports done false; the
// word-at-a-time loop goes on from there. done is true when it took the
// whole list: next is then just past the ']'.
func intBlocks(b []byte, i int, dst []int32) (out []int32, next int, done bool) {
	prev := i - 1 // the byte before the current element: '[', ',' or ' '
	// Every load below is of 8 bytes starting before base+64, so inside b
	// while base+72 <= len(b): they go without bounds checks.
	for base := i; base+72 <= len(b); base += 64 {
		var mask uint64 // bit k: b[base+k] is not a digit
		for k := 0; k < 64; k += 8 {
			mask |= bitsOf(notDigits(word(b, base+k))) << k
		}
		for ; mask != 0; mask &= mask - 1 {
			p := base + bits.TrailingZeros64(mask)
			n := p - prev - 1 // digits between the two separators
			sep := byte(word(b, p))
			w := word(b, prev+1) - 0x3030303030303030 // no borrow below the n digits
			if uint(n-1) > 7 || (n > 1 && byte(w) == 0) {
				if n == 0 && sep == ' ' { // after ',' or ' ': a blank before the element
					prev = p
					continue
				}
				return dst, prev + 1, false // empty, over 8 digits, leading zero
			}
			v := digits(w, n)
			switch sep {
			case ',':
				dst = append(dst, int32(v))
				prev = p
			case ']':
				return append(dst, int32(v)), p + 1, true
			default: // a blank before a separator, '.', 'e', ...
				return dst, prev + 1, false
			}
		}
	}
	return dst, prev + 1, false
}

// word loads the 8 bytes of b at i, which the caller keeps inside b
// (no bounds check).
func word(b []byte, i int) uint64 {
	return binary.LittleEndian.Uint64(unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(b)), i)), 8))
}

// notDigits sets the high bit of each byte of x that is not an ASCII
// digit, byte by byte without carries between bytes (a subtraction's
// borrow from a comma would make the next byte's '0' look like a
// separator): t >= '0' and t > '9' from two sums on the low seven bits,
// the high bit from the byte itself.
func notDigits(x uint64) uint64 {
	t := x & 0x7F7F7F7F7F7F7F7F
	ge0 := t + 0x5050505050505050 // high bit: t >= '0'
	gt9 := t + 0x4646464646464646 // high bit: t > '9'
	return (^ge0 | gt9 | x) & 0x8080808080808080
}

// bitsOf gathers the high bits of x's bytes into 8 bits, byte k to bit k
// (a multiply; no two partial products share a bit).
func bitsOf(x uint64) uint64 { return (x >> 7) * 0x0102040810204080 >> 56 }

// digits is the value of the n (0 to 8) digits at the bottom of w, from
// which '0' was subtracted byte by byte, the first digit lowest.
func digits(w uint64, n int) uint64 {
	v := w << (64 - 8*uint(n))
	v = (v*10 + v>>8) & 0x00FF00FF00FF00FF
	v = (v*100 + v>>16) & 0x0000FFFF0000FFFF
	return (v*10000 + v>>32) & 0xFFFFFFFF
}

// pow10u holds 10^n for the digit runs of fastFloats.
var pow10u = [...]uint64{1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8}

// pow10 holds the powers of ten that float64 represents exactly.
var pow10 = [...]float64{1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
	1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22}

// fastFloats appends the float32 values of the array at the cursor to dst,
// each parsed exactly as floatValue (correctly rounded to float64) and
// then rounded to float32. ok is false (cursor unchanged) on NaN or
// Infinity tokens, values that are not finite as float32, and anything
// that is not plain JSON number syntax.
func (l *lexer) fastFloats(dst []float32) (out []float32, ok bool) {
	b := l.buf
	i := l.pos
	if i >= len(b) || b[i] != '[' {
		return dst, false
	}
	i++
	for i < len(b) && isWS(b[i]) {
		i++
	}
	if i < len(b) && b[i] == ']' {
		l.pos = i + 1
		return dst, true
	}
	for {
		start := i
		neg := false
		if i < len(b) && b[i] == '-' {
			neg = true
			i++
		}
		// The common shape first: one integer digit, a point, 1 to 15
		// fraction digits and a ',' or ']' right after them
		// ("-0.00353707,"). The fraction is read from two words at once,
		// without a branch on its length (which varies from number to
		// number and would be mispredicted): n1 digits of the first word,
		// then, only when all eight of it are digits, n2 of the second.
		// It yields what the general path below does (the same mantissa
		// and exponent, the same division).
		if i+18 <= len(b) && b[i+1] == '.' && b[i]-'0' <= 9 {
			w1 := word(b, i+2) - 0x3030303030303030
			w2 := word(b, i+10) - 0x3030303030303030
			n1 := bits.TrailingZeros64((w1|(w1+0x7676767676767676))&0x8080808080808080) >> 3
			n2 := bits.TrailingZeros64((w2|(w2+0x7676767676767676))&0x8080808080808080) >> 3
			n2 &= -(n1 >> 3) // n1 is 8 or less: n2 counts only when n1 is 8
			n := n1 + n2     // 16 means 16 or more: no separator found
			sep := b[i+2+n&15]
			if uint(n-1) < 15 && (sep == ',' || sep == ']') {
				m := (uint64(b[i]-'0')*pow10u[n1]+digits(w1, n1))*pow10u[n2] + digits(w2, n2)
				if m < 1<<53 {
					f := float64(m) / pow10[n]
					if neg {
						f = -f
					}
					dst = append(dst, float32(f))
					i += 2 + n + 1
					if sep == ']' {
						l.pos = i
						return dst, true
					}
					for i < len(b) && isWS(b[i]) {
						i++
					}
					continue
				}
			}
		}
		// The general path: the mantissa's digits (m, exact while
		// !truncated) and the decimal exponent.
		var m uint64
		exp := 0
		truncated := false
		if i >= len(b) {
			return dst, false
		}
		switch c := b[i]; {
		case c == '0':
			i++
		case c >= '1' && c <= '9':
			for i < len(b) && b[i] >= '0' && b[i] <= '9' {
				if m < 1e18 {
					m = m*10 + uint64(b[i]-'0')
				} else {
					truncated = true
					exp++
				}
				i++
			}
		default:
			return dst, false
		}
		// comma: the fraction ended on a comma seen in the word loaded
		// for its digits; nothing after it needs another look.
		comma := false
		if i < len(b) && b[i] == '.' {
			i++
			d := i
			// Eight digits at a time while m has room, then one at a time.
			for i+8 <= len(b) && m < 1e10 {
				w := binary.LittleEndian.Uint64(b[i:]) - 0x3030303030303030
				n := bits.TrailingZeros64((w|(w+0x7676767676767676))&0x8080808080808080) >> 3
				if n == 0 {
					break
				}
				v := w << (64 - 8*uint(n))
				v = (v*10 + v>>8) & 0x00FF00FF00FF00FF
				v = (v*100 + v>>16) & 0x0000FFFF0000FFFF
				v = (v*10000 + v>>32) & 0xFFFFFFFF
				m = m*pow10u[n] + v
				exp -= n
				i += n
				if n < 8 {
					comma = byte(w>>(8*uint(n))) == ','+0x100-'0' // no borrow: the bytes below are digits
					break
				}
			}
			for !comma && i < len(b) && b[i] >= '0' && b[i] <= '9' {
				if m < 1e18 {
					m = m*10 + uint64(b[i]-'0')
					exp--
				} else {
					truncated = true
				}
				i++
			}
			if i == d {
				return dst, false
			}
		}
		if !comma && i < len(b) && (b[i] == 'e' || b[i] == 'E') {
			i++
			eneg := false
			if i < len(b) && (b[i] == '+' || b[i] == '-') {
				eneg = b[i] == '-'
				i++
			}
			d, e := i, 0
			for i < len(b) && b[i] >= '0' && b[i] <= '9' {
				if e < 10000 {
					e = e*10 + int(b[i]-'0')
				}
				i++
			}
			if i == d {
				return dst, false
			}
			if eneg {
				e = -e
			}
			exp += e
		}
		var f float64
		switch {
		case m == 0:
			f = 0
		case !truncated && m < 1<<53 && exp >= -22 && exp <= 22:
			// Exact operands, one correctly rounded operation (Clinger).
			f = float64(m)
			if exp < 0 {
				f /= pow10[-exp]
			} else {
				f *= pow10[exp]
			}
		default:
			var err error
			f, err = parseNumber(b[start:i])
			if err != nil || math.IsInf(float64(float32(f)), 0) {
				return dst, false
			}
			neg = false // the sign is in the token
		}
		// On the exact path |f| < 2^53 * 1e22 < MaxFloat32: float32(f) is
		// finite there, only ParseFloat's values need the check above.
		if neg {
			f = -f
		}
		dst = append(dst, float32(f))
		if comma {
			i++
			for i < len(b) && isWS(b[i]) {
				i++
			}
			continue
		}
		for i < len(b) && isWS(b[i]) {
			i++
		}
		if i >= len(b) {
			return dst, false
		}
		switch b[i] {
		case ',':
			i++
			for i < len(b) && isWS(b[i]) {
				i++
			}
		case ']':
			l.pos = i + 1
			return dst, true
		default:
			return dst, false
		}
	}
}
