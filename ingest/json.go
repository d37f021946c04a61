package ingest

import (
	"encoding/binary"
	"errors"
	"math"
	"strconv"
	"unicode/utf8"
	"unsafe"
)

// errSyntax marks a JSON syntax error; the decoder turns it into
// malformed_json. It carries no position so that building it costs nothing;
// the position is added once, when the record is rejected.
var errSyntax = errors.New("invalid JSON")

// errTooDeep marks nesting beyond maxDepth.
var errTooDeep = errors.New("nesting too deep")

// maxDepth bounds the nesting of skipped values so that a hostile record
// cannot exhaust the stack.
const maxDepth = 512

// lexer is a strict, allocation-free JSON scanner over one record. It
// accepts RFC 8259 JSON plus the bare tokens NaN, Infinity and -Infinity
// that Python's json module writes, so that those reach the numeric checks
// (and become non_finite) instead of being called malformed.
type lexer struct {
	buf []byte
	pos int
	// scratch holds the unescaped text of the last string; valid until the
	// next call to str.
	scratch []byte
	// repaired counts invalid UTF-8 sequences and lone surrogates replaced
	// by U+FFFD in this record.
	repaired int
}

func (l *lexer) reset(b []byte) {
	l.buf, l.pos, l.repaired = b, 0, 0
}

func (l *lexer) ws() {
	for l.pos < len(l.buf) {
		switch l.buf[l.pos] {
		case ' ', '\t', '\n', '\r':
			l.pos++
		default:
			return
		}
	}
}

// peek skips whitespace and returns the next byte, or 0 at the end.
func (l *lexer) peek() byte {
	l.ws()
	if l.pos < len(l.buf) {
		return l.buf[l.pos]
	}
	return 0
}

// end skips whitespace and reports whether the input is exhausted.
func (l *lexer) end() bool {
	l.ws()
	return l.pos >= len(l.buf)
}

func (l *lexer) expect(c byte) error {
	if l.peek() != c {
		return errSyntax
	}
	l.pos++
	return nil
}

// literal consumes the exact word w.
func (l *lexer) literal(w string) error {
	if len(l.buf)-l.pos < len(w) || string(l.buf[l.pos:l.pos+len(w)]) != w {
		return errSyntax
	}
	l.pos += len(w)
	return nil
}

// str reads a JSON string at the cursor and returns its unescaped, UTF-8
// repaired bytes. The result aliases either the input or l.scratch and is
// valid until the next call.
func (l *lexer) str() ([]byte, error) {
	if l.peek() != '"' {
		return nil, errSyntax
	}
	l.pos++
	start := l.pos
	// Fast path: no escapes, all ASCII; eight bytes at a time first.
	for l.pos+8 <= len(l.buf) && !special8(binary.LittleEndian.Uint64(l.buf[l.pos:])) {
		l.pos += 8
	}
	for l.pos < len(l.buf) {
		c := l.buf[l.pos]
		if c == '"' {
			l.pos++
			return l.buf[start : l.pos-1], nil
		}
		if c == '\\' || c < 0x20 || c >= 0x80 {
			break
		}
		l.pos++
	}
	l.scratch = append(l.scratch[:0], l.buf[start:l.pos]...)
	for l.pos < len(l.buf) {
		c := l.buf[l.pos]
		switch {
		case c == '"':
			l.pos++
			return l.scratch, nil
		case c < 0x20:
			return nil, errSyntax
		case c == '\\':
			if err := l.escape(); err != nil {
				return nil, err
			}
		case c < 0x80:
			l.scratch = append(l.scratch, c)
			l.pos++
		default:
			r, n := utf8.DecodeRune(l.buf[l.pos:])
			if r == utf8.RuneError && n <= 1 {
				l.repaired++
				l.scratch = utf8.AppendRune(l.scratch, utf8.RuneError)
				l.pos++
				continue
			}
			l.scratch = append(l.scratch, l.buf[l.pos:l.pos+n]...)
			l.pos += n
		}
	}
	return nil, errSyntax
}

// skipStr consumes the JSON string at the cursor exactly as str does
// (the same errors, the same repair count) without building its text.
func (l *lexer) skipStr() error {
	if l.peek() != '"' {
		return errSyntax
	}
	l.pos++
	b := l.buf
	for {
		for l.pos+8 <= len(b) && !special8(binary.LittleEndian.Uint64(b[l.pos:])) {
			l.pos += 8
		}
		if l.pos >= len(b) {
			return errSyntax
		}
		switch c := b[l.pos]; {
		case c == '"':
			l.pos++
			return nil
		case c < 0x20:
			return errSyntax
		case c == '\\':
			// The one-letter escapes have nothing to check: skipped in
			// place; \u (surrogates, repairs) goes through escape.
			if l.pos+1 < len(b) && simpleEscape[b[l.pos+1]] {
				l.pos += 2
				continue
			}
			l.scratch = l.scratch[:0]
			if err := l.escape(); err != nil {
				return err
			}
		case c < 0x80:
			l.pos++
		default:
			r, n := utf8.DecodeRune(b[l.pos:])
			if r == utf8.RuneError && n <= 1 {
				l.repaired++
				n = 1
			}
			l.pos += n
		}
	}
}

// simpleEscape marks the letters of the JSON escapes other than \u.
var simpleEscape = [256]bool{'"': true, '\\': true, '/': true, 'b': true, 'f': true, 'n': true, 'r': true, 't': true}

func (l *lexer) escape() error {
	if l.pos+1 >= len(l.buf) {
		return errSyntax
	}
	c := l.buf[l.pos+1]
	l.pos += 2
	switch c {
	case '"', '\\', '/':
		l.scratch = append(l.scratch, c)
	case 'b':
		l.scratch = append(l.scratch, '\b')
	case 'f':
		l.scratch = append(l.scratch, '\f')
	case 'n':
		l.scratch = append(l.scratch, '\n')
	case 'r':
		l.scratch = append(l.scratch, '\r')
	case 't':
		l.scratch = append(l.scratch, '\t')
	case 'u':
		r, ok := l.hex4()
		if !ok {
			return errSyntax
		}
		if utf16IsSurrogate(r) {
			// A high surrogate followed by an escaped low one makes a pair;
			// anything else is a lone surrogate, replaced like invalid UTF-8.
			if r < 0xdc00 && l.pos+1 < len(l.buf) && l.buf[l.pos] == '\\' && l.buf[l.pos+1] == 'u' {
				save := l.pos
				l.pos += 2
				r2, ok := l.hex4()
				if !ok {
					return errSyntax
				}
				if r2 >= 0xdc00 && r2 < 0xe000 {
					l.scratch = utf8.AppendRune(l.scratch, (r-0xd800)<<10+(r2-0xdc00)+0x10000)
					return nil
				}
				l.pos = save
			}
			l.repaired++
			r = utf8.RuneError
		}
		l.scratch = utf8.AppendRune(l.scratch, r)
	default:
		return errSyntax
	}
	return nil
}

// special8 reports whether any of the eight bytes in w (little endian)
// may end the ASCII fast path of str: a quote, a backslash, a control
// character or a non-ASCII byte. False positives are allowed (the byte
// loop decides), false negatives are not.
func special8(w uint64) bool {
	const (
		ones  = 0x0101010101010101
		highs = 0x8080808080808080
	)
	zero := func(x uint64) uint64 { return (x - ones) & ^x & highs }
	quote := zero(w ^ (ones * '"'))
	backslash := zero(w ^ (ones * '\\'))
	control := (w - ones*0x20) & ^w & highs // a byte below 0x20 (exact for ASCII bytes)
	return (quote|backslash|control)|(w&highs) != 0
}

func utf16IsSurrogate(r rune) bool { return r >= 0xd800 && r < 0xe000 }

func (l *lexer) hex4() (rune, bool) {
	if l.pos+4 > len(l.buf) {
		return 0, false
	}
	r, ok := hexRune(l.buf[l.pos : l.pos+4])
	if ok {
		l.pos += 4
	}
	return r, ok
}

// numToken returns the bytes of the number at the cursor, checking the
// JSON grammar (and the Python special tokens).
func (l *lexer) numToken() ([]byte, error) {
	l.ws()
	start := l.pos
	b := l.buf
	i := l.pos
	if i < len(b) && b[i] == '-' {
		i++
	}
	if i < len(b) && (b[i] == 'N' || b[i] == 'I') {
		w := "Infinity"
		if b[i] == 'N' {
			w = "NaN"
			if i != start { // -NaN is not a Python token
				return nil, errSyntax
			}
		}
		l.pos = i
		if err := l.literal(w); err != nil {
			return nil, err
		}
		return b[start:l.pos], nil
	}
	if i >= len(b) {
		return nil, errSyntax
	}
	switch {
	case b[i] == '0':
		i++
	case b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		return nil, errSyntax
	}
	if i < len(b) && b[i] == '.' {
		i++
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == d {
			return nil, errSyntax
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == d {
			return nil, errSyntax
		}
	}
	l.pos = i
	return b[start:i], nil
}

// errNotInteger and errRange are value (not syntax) errors of numbers.
var (
	errNotInteger = errors.New("not an integer")
	errRange      = errors.New("out of range")
)

// intValue converts a number token to int64, exactly: integral values
// written with a fraction or an exponent (3.0, 1e3, 9.21e18) are accepted,
// anything with a non-zero fractional part (1.5, 1e-400) is errNotInteger,
// and integers beyond int64 are errRange.
func intValue(tok []byte) (int64, error) {
	neg := false
	i := 0
	if len(tok) > 0 && tok[0] == '-' {
		neg, i = true, 1
	}
	if i < len(tok) && (tok[i] == 'N' || tok[i] == 'I') {
		return 0, errNotInteger // NaN, ±Infinity
	}
	// Fast path: plain digits.
	if len(tok)-i <= 18 {
		var v int64
		j := i
		for ; j < len(tok) && tok[j] >= '0' && tok[j] <= '9'; j++ {
			v = v*10 + int64(tok[j]-'0')
		}
		if j == len(tok) && j > i {
			if neg {
				return -v, nil
			}
			return v, nil
		}
	}
	// Significant digits (leading zeros dropped) and the position of the
	// decimal point among them.
	var buf [32]byte
	digits := buf[:0]
	point, sawPoint := 0, false
	for ; i < len(tok); i++ {
		c := tok[i]
		if c == '.' {
			sawPoint = true
			continue
		}
		if c < '0' || c > '9' {
			break
		}
		if len(digits) == 0 && c == '0' {
			if sawPoint {
				point--
			}
			continue
		}
		digits = append(digits, c)
		if !sawPoint {
			point++
		}
	}
	if i < len(tok) { // exponent
		i++
		eneg := false
		if i < len(tok) && (tok[i] == '+' || tok[i] == '-') {
			eneg = tok[i] == '-'
			i++
		}
		e := 0
		for ; i < len(tok); i++ {
			if e < 1_000_000 {
				e = e*10 + int(tok[i]-'0')
			}
		}
		if eneg {
			e = -e
		}
		point += e
	}
	for len(digits) > 0 && digits[len(digits)-1] == '0' {
		digits = digits[:len(digits)-1] // trailing zeros do not change the value
	}
	switch {
	case len(digits) == 0:
		return 0, nil
	case point < len(digits):
		return 0, errNotInteger // a non-zero digit after the point
	case point > 19:
		return 0, errRange
	}
	var v uint64
	for k := 0; k < point; k++ {
		d := uint64(0)
		if k < len(digits) {
			d = uint64(digits[k] - '0')
		}
		if v > (math.MaxUint64-d)/10 {
			return 0, errRange
		}
		v = v*10 + d
	}
	switch {
	case !neg && v <= math.MaxInt64:
		return int64(v), nil
	case neg && v <= 1<<63:
		return -int64(v), nil
	}
	return 0, errRange
}

// floatValue converts a number token to float64. Overflow yields ±Inf
// (reported by the caller as non_finite), never an error.
func floatValue(tok []byte) (float64, error) {
	switch string(tok) {
	case "NaN":
		return math.NaN(), nil
	case "Infinity":
		return math.Inf(1), nil
	case "-Infinity":
		return math.Inf(-1), nil
	}
	f, err := parseNumber(tok)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && ne.Err == strconv.ErrRange {
			return f, nil // ±Inf or a denormal rounded to 0
		}
		return 0, errSyntax
	}
	return f, nil
}

// longNumber is the length past which a number token is rewritten by
// normalizeLong before strconv.ParseFloat reads it: Go's slow path keeps
// 800 digits and, for a mantissa with more integer digits than that,
// loses the decimal point's place ("1" + 800 zeros + "e-800" reads as
// 0.1).
const longNumber = 700

// parseNumber is strconv.ParseFloat of a JSON number token (float64,
// correctly rounded), long tokens normalised first (see longNumber): the
// one place every float of a record is read, the fast paths' fallbacks
// included.
func parseNumber(tok []byte) (float64, error) {
	if len(tok) > longNumber {
		tok = normalizeLong(tok)
	}
	return strconv.ParseFloat(unsafe.String(unsafe.SliceData(tok), len(tok)), 64)
}

// normalizeLong rewrites a valid JSON number token as "0." + its
// significant digits + "e" + the exponent that keeps its value, a form
// ParseFloat reads correctly (digits past its 800 only round).
func normalizeLong(tok []byte) []byte {
	i := 0
	out := make([]byte, 0, len(tok)+24)
	if tok[0] == '-' {
		out = append(out, '-')
		i++
	}
	digits := make([]byte, 0, len(tok))
	intDigits := 0
	for ; i < len(tok) && tok[i] >= '0' && tok[i] <= '9'; i++ {
		digits = append(digits, tok[i])
		intDigits++
	}
	if i < len(tok) && tok[i] == '.' {
		for i++; i < len(tok) && tok[i] >= '0' && tok[i] <= '9'; i++ {
			digits = append(digits, tok[i])
		}
	}
	exp := 0
	if i < len(tok) && (tok[i] == 'e' || tok[i] == 'E') {
		i++
		neg := false
		if tok[i] == '+' || tok[i] == '-' {
			neg = tok[i] == '-'
			i++
		}
		for ; i < len(tok); i++ {
			if exp < 1e9 { // beyond, the value is 0 or infinite whatever the digits
				exp = exp*10 + int(tok[i]-'0')
			}
		}
		if neg {
			exp = -exp
		}
	}
	z := 0
	for z < len(digits) && digits[z] == '0' {
		z++
	}
	if z == len(digits) {
		return append(out, '0')
	}
	out = append(out, "0."...)
	out = append(out, digits[z:]...)
	out = append(out, 'e')
	return strconv.AppendInt(out, int64(exp+intDigits-z), 10)
}

// skip consumes one JSON value of any kind, validating it.
func (l *lexer) skip(depth int) error {
	if depth > maxDepth {
		return errTooDeep
	}
	switch l.peek() {
	case '{':
		l.pos++
		if l.peek() == '}' {
			l.pos++
			return nil
		}
		for {
			if err := l.skipStr(); err != nil {
				return err
			}
			if err := l.expect(':'); err != nil {
				return err
			}
			if err := l.skip(depth + 1); err != nil {
				return err
			}
			switch l.peek() {
			case ',':
				l.pos++
			case '}':
				l.pos++
				return nil
			default:
				return errSyntax
			}
		}
	case '[':
		l.pos++
		if l.peek() == ']' {
			l.pos++
			return nil
		}
		for {
			if err := l.skip(depth + 1); err != nil {
				return err
			}
			switch l.peek() {
			case ',':
				l.pos++
			case ']':
				l.pos++
				return nil
			default:
				return errSyntax
			}
		}
	case '"':
		return l.skipStr()
	case 't':
		return l.literal("true")
	case 'f':
		return l.literal("false")
	case 'n':
		return l.literal("null")
	default:
		_, err := l.numToken()
		return err
	}
}

// rawCopy returns a fresh copy of the JSON text consumed since start, with
// invalid UTF-8 replaced by U+FFFD and lone surrogate escapes (\ud800)
// replaced by \ufffd, so that JSON readers downstream accept it; before is
// l.repaired at start.
func (l *lexer) rawCopy(start, before int) []byte {
	text := l.buf[start:l.pos]
	if l.repaired == before {
		// make then copy: one exact-size allocation, not cleared first
		// (append would round up to a size class and clear the tail).
		out := make([]byte, len(text))
		copy(out, text)
		return out
	}
	out := make([]byte, 0, len(text)+8)
	inStr := false
	for i := 0; i < len(text); {
		c := text[i]
		switch {
		case c == '"':
			inStr = !inStr
			out = append(out, c)
			i++
		case inStr && c == '\\' && i+1 < len(text) && text[i+1] == 'u' && i+6 <= len(text):
			r, _ := hexRune(text[i+2 : i+6])
			if r >= 0xd800 && r < 0xdc00 && i+12 <= len(text) && text[i+6] == '\\' && text[i+7] == 'u' {
				if r2, _ := hexRune(text[i+8 : i+12]); r2 >= 0xdc00 && r2 < 0xe000 {
					out = append(out, text[i:i+12]...) // a valid pair
					i += 12
					continue
				}
			}
			if r >= 0xd800 && r < 0xe000 {
				out = append(out, `\ufffd`...)
			} else {
				out = append(out, text[i:i+6]...)
			}
			i += 6
		case inStr && c == '\\' && i+1 < len(text):
			out = append(out, text[i:i+2]...)
			i += 2
		case c < utf8.RuneSelf:
			out = append(out, c)
			i++
		default:
			r, n := utf8.DecodeRune(text[i:])
			if r == utf8.RuneError && n <= 1 {
				out = utf8.AppendRune(out, utf8.RuneError)
				i++
				continue
			}
			out = append(out, text[i:i+n]...)
			i += n
		}
	}
	return out
}

// hexRune decodes four hex digits; ok is false if one is not a digit.
func hexRune(b []byte) (r rune, ok bool) {
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
