// Package termtext makes text from records and errors safe to print on a
// terminal: what a terminal would act on instead of showing is escaped.
package termtext

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Escape escapes what a terminal would act on instead of showing:
// newline, carriage return and tab as \n, \r, \t; other C0 and C1
// controls and DEL as \xNN or \u00NN (ESC starts escape sequences that
// recolour, move the cursor, set the window title or write the
// clipboard); the layout controls (IsLayoutControl) as \uNNNN; bytes
// that are not UTF-8 as \xNN. Backslashes are kept as they are.
func Escape(s string) string { return escape(s, false) }

// EscapeKeepLines is Escape for text meant to span lines, such as an
// error message: newline and tab are kept as they are.
func EscapeKeepLines(s string) string { return escape(s, true) }

func escape(s string, keepLines bool) string {
	clean := utf8.ValidString(s)
	for _, r := range s {
		if NeedsEscape(r) && !(keepLines && (r == '\n' || r == '\t')) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case keepLines && (r == '\n' || r == '\t'):
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x80 && NeedsEscape(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case NeedsEscape(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// NeedsEscape says whether Escape escapes the character r.
func NeedsEscape(r rune) bool {
	return r < 0x20 || r >= 0x7f && r <= 0x9f || IsLayoutControl(r)
}

// IsLayoutControl says whether r is a Unicode bidirectional control
// (U+061C, U+200E, U+200F, U+202A-U+202E, U+2066-U+2069) or a line or
// paragraph separator (U+2028, U+2029): characters that reorder or break
// the text around them instead of showing.
func IsLayoutControl(r rune) bool {
	return r == 0x061c || r == 0x200e || r == 0x200f || r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069 || r == 0x2028 || r == 0x2029
}
