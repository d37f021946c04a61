package duckdb

import (
	"bytes"
	"database/sql"
	"encoding/base64"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	duckdbdrv "github.com/duckdb/duckdb-go/v2"
	"github.com/rllm-pipe/rllm-pipe/connectors/termtext"
)

// Output formats of WriteRows.
const (
	FormatTable = "table" // aligned columns for terminals (all rows are held to measure them)
	FormatCSV   = "csv"   // RFC 4180, a header line; NULL is an empty field
	FormatJSONL = "jsonl" // one JSON object per row, keys in column order
)

// Formats lists the output formats.
func Formats() []string { return []string{FormatTable, FormatCSV, FormatJSONL} }

// tableCell is the widest a table cell gets; longer values are cut with
// an ellipsis (CSV and JSON lines are never cut).
const tableCell = 60

// WriteRows writes rows to w in format and returns the number of rows.
// CSV and JSON lines stream and keep full precision (floats in their
// shortest exact form; lists, structs and maps as JSON text in CSV);
// a table rounds floats to 6 significant digits. Timestamps are RFC 3339
// in UTC, blobs base64; NaN and infinities are null in JSON.
//
// Values may hold anything a record carried, terminal escape sequences
// included. A table escapes control characters and bidirectional
// overrides (printable), in values and column names; JSON lines escape
// them as JSON (\u001b), which reads back the same; CSV keeps them as
// they are: it is exact and meant for programs, and RFC 4180 has no
// escape for them (quoting is all it has), so any other rendering would
// change the values a program reads.
func WriteRows(w io.Writer, rows *sql.Rows, format string) (int, error) {
	cols, err := rows.Columns()
	if err != nil {
		return 0, fmt.Errorf("columns: %w", err)
	}
	var emit func([]any) error
	var flush func() error
	switch format {
	case FormatCSV:
		cw := csv.NewWriter(w)
		if err := cw.Write(cols); err != nil {
			return 0, fmt.Errorf("write csv: %w", err)
		}
		rec := make([]string, len(cols))
		emit = func(vals []any) error {
			for i, v := range vals {
				rec[i] = textValue(v, false)
			}
			return cw.Write(rec)
		}
		flush = func() error { cw.Flush(); return cw.Error() }
	case FormatJSONL:
		keys := make([][]byte, len(cols))
		for i, c := range cols {
			keys[i], _ = json.Marshal(c)
		}
		var buf bytes.Buffer
		emit = func(vals []any) error {
			buf.Reset()
			buf.WriteByte('{')
			for i, v := range vals {
				if i > 0 {
					buf.WriteByte(',')
				}
				buf.Write(keys[i])
				buf.WriteByte(':')
				if err := writeJSON(&buf, jsonValue(v)); err != nil {
					return fmt.Errorf("column %s: %w", cols[i], err)
				}
			}
			buf.WriteString("}\n")
			_, err := w.Write(buf.Bytes())
			return err
		}
		flush = func() error { return nil }
	case FormatTable:
		t := &table{cols: cols}
		emit = func(vals []any) error { t.add(vals); return nil }
		flush = func() error { return t.write(w) }
	default:
		return 0, fmt.Errorf("unknown format %q (want %s)", format, strings.Join(Formats(), ", "))
	}
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	n := 0
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return n, fmt.Errorf("read row %d: %w", n+1, err)
		}
		if err := emit(vals); err != nil {
			return n, fmt.Errorf("write row %d: %w", n+1, err)
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return n, classify(err)
	}
	if err := flush(); err != nil {
		return n, fmt.Errorf("write rows: %w", err)
	}
	return n, nil
}

// textValue renders v for CSV (exact) or a table (short).
func textValue(v any, short bool) string {
	switch x := v.(type) {
	case nil:
		if short {
			return "NULL"
		}
		return ""
	case string:
		return x
	case []byte:
		return base64.StdEncoding.EncodeToString(x)
	case bool:
		return strconv.FormatBool(x)
	case int8, int16, int32, int64, int, uint8, uint16, uint32, uint64, uint:
		return fmt.Sprint(x)
	case float64:
		if short {
			return strconv.FormatFloat(x, 'g', 6, 64)
		}
		return strconv.FormatFloat(x, 'g', -1, 64)
	case float32:
		if short {
			return strconv.FormatFloat(float64(x), 'g', 6, 32)
		}
		return strconv.FormatFloat(float64(x), 'g', -1, 32)
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	case *big.Int:
		return x.String()
	case duckdbdrv.Decimal:
		return x.String()
	case duckdbdrv.UUID:
		return x.String()
	case []any, map[string]any, duckdbdrv.Map, duckdbdrv.OrderedMap, *duckdbdrv.OrderedMap, duckdbdrv.Interval, duckdbdrv.Union:
		var buf bytes.Buffer
		if err := writeJSON(&buf, jsonValue(x)); err != nil {
			return fmt.Sprint(x)
		}
		return strings.TrimSuffix(buf.String(), "\n")
	case fmt.Stringer:
		return x.String()
	}
	return fmt.Sprint(v)
}

// jsonValue turns what duckdb-go scans into values encoding/json writes
// faithfully.
func jsonValue(v any) any {
	switch x := v.(type) {
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil
		}
		return x
	case float32:
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return nil
		}
		return json.Number(strconv.FormatFloat(float64(x), 'g', -1, 32))
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	case *big.Int:
		return json.Number(x.String())
	case duckdbdrv.Decimal:
		return json.Number(x.String())
	case duckdbdrv.UUID:
		return x.String()
	case duckdbdrv.Union:
		return map[string]any{x.Tag: jsonValue(x.Value)}
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonValue(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = jsonValue(e)
		}
		return out
	case duckdbdrv.Map:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[textValue(k, false)] = jsonValue(e)
		}
		return out
	case duckdbdrv.OrderedMap:
		return orderedObject(&x)
	case *duckdbdrv.OrderedMap:
		return orderedObject(x)
	}
	return v
}

// jsonObject is a JSON object that keeps its key order.
type jsonObject struct {
	keys []string
	vals []any
}

func orderedObject(m *duckdbdrv.OrderedMap) jsonObject {
	var o jsonObject
	for i, k := range m.Keys() {
		o.keys = append(o.keys, textValue(k, false))
		o.vals = append(o.vals, jsonValue(m.Values()[i]))
	}
	return o
}

// MarshalJSON implements json.Marshaler.
func (o jsonObject) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, k := range o.keys {
		if i > 0 {
			buf.WriteByte(',')
		}
		if err := writeJSON(&buf, k); err != nil {
			return nil, err
		}
		buf.WriteByte(':')
		if err := writeJSON(&buf, o.vals[i]); err != nil {
			return nil, err
		}
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// writeJSON appends v as JSON to buf. It also escapes the characters of
// jsonEscapes as \uNNNN (they can only occur inside strings, so the
// text stays valid JSON of the same value), so that jsonl on a terminal
// is as safe as the table.
func writeJSON(buf *bytes.Buffer, v any) error {
	start := buf.Len()
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	buf.Truncate(buf.Len() - 1) // the encoder's newline
	if out := buf.Bytes()[start:]; needsJSONEscape(out) {
		esc := jsonEscapes.Replace(string(out))
		buf.Truncate(start)
		buf.WriteString(esc)
	}
	return nil
}

// needsJSONEscape is a fast check for jsonEscapes: every character it
// replaces is encoded in UTF-8 with a lead byte 0xC2 (U+0080-U+009F),
// 0xD8 (U+061C) or 0xE2 (U+2000-U+2FFF), or is DEL.
func needsJSONEscape(b []byte) bool {
	for _, c := range b {
		if c == 0x7f || c == 0xc2 || c == 0xd8 || c == 0xe2 {
			return true
		}
	}
	return false
}

// printable escapes what a terminal would act on instead of showing
// (termtext.Escape). Backslashes are kept as they are: the table is for
// reading, csv and jsonl are exact.
func printable(s string) string { return termtext.Escape(s) }

// TerminalSafe is printable for text meant to span lines, such as an
// error message: newline and tab are kept as they are.
func TerminalSafe(s string) string { return termtext.EscapeKeepLines(s) }

// ShowLayoutControls writes the layout controls in s (see
// termtext.IsLayoutControl) as \uNNNN, as a table shows them, and keeps every
// other character: for record text put in a web page, where a right-to-left
// override would reverse what follows it (the trick that makes a file name
// or a line of code read differently from what it is).
func ShowLayoutControls(s string) string {
	if strings.IndexByte(s, 0xd8) < 0 && strings.IndexByte(s, 0xe2) < 0 {
		return s // none of them can be there: their UTF-8 begins with D8 or E2
	}
	var b strings.Builder
	last := 0
	for i, r := range s {
		if termtext.IsLayoutControl(r) {
			b.WriteString(s[last:i])
			fmt.Fprintf(&b, `\u%04x`, r)
			last = i + utf8.RuneLen(r)
		}
	}
	if last == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

// jsonEscapes are the characters encoding/json writes raw that a terminal
// may act on: C1 controls and the bidirectional controls (it escapes C0
// and U+2028/U+2029 itself).
var jsonEscapes = func() *strings.Replacer {
	var pairs []string
	add := func(r rune) { pairs = append(pairs, string(r), fmt.Sprintf(`\u%04x`, r)) }
	for r := rune(0x7f); r <= 0x9f; r++ {
		add(r)
	}
	for _, r := range []rune{0x061c, 0x200e, 0x200f, 0x202a, 0x202b, 0x202c, 0x202d, 0x202e, 0x2066, 0x2067, 0x2068, 0x2069} {
		add(r)
	}
	return strings.NewReplacer(pairs...)
}()

// table holds rows to align them.
type table struct {
	cols    []string
	rows    [][]string
	numeric []bool // right-aligned: every non-null value is a number
}

func (t *table) add(vals []any) {
	if t.numeric == nil {
		t.numeric = make([]bool, len(t.cols))
		for i := range t.numeric {
			t.numeric[i] = true
		}
	}
	row := make([]string, len(vals))
	for i, v := range vals {
		row[i] = cell(textValue(v, true))
		switch v.(type) {
		case nil, int8, int16, int32, int64, int, uint8, uint16, uint32, uint64, uint, float32, float64, *big.Int, duckdbdrv.Decimal:
		default:
			t.numeric[i] = false
		}
	}
	t.rows = append(t.rows, row)
}

// cell makes s fit on one line of a terminal table, with nothing a
// terminal would act on (see printable).
func cell(s string) string {
	s = printable(s)
	if utf8.RuneCountInString(s) <= tableCell {
		return s
	}
	r := []rune(s)
	return string(r[:tableCell-1]) + "…"
}

func (t *table) write(w io.Writer) error {
	cols := make([]string, len(t.cols))
	width := make([]int, len(t.cols))
	for i, c := range t.cols {
		cols[i] = cell(c)
		width[i] = utf8.RuneCountInString(cols[i])
	}
	for _, r := range t.rows {
		for i, s := range r {
			width[i] = max(width[i], utf8.RuneCountInString(s))
		}
	}
	var b strings.Builder
	line := func(vals []string) {
		var l strings.Builder
		for i, s := range vals {
			if i > 0 {
				l.WriteString("  ")
			}
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(s))
			if t.numeric != nil && t.numeric[i] {
				l.WriteString(pad + s)
			} else {
				l.WriteString(s + pad)
			}
		}
		b.WriteString(strings.TrimRight(l.String(), " "))
		b.WriteString("\n")
	}
	line(cols)
	rule := make([]string, len(t.cols))
	for i := range rule {
		rule[i] = strings.Repeat("-", width[i])
	}
	line(rule)
	for _, r := range t.rows {
		line(r)
	}
	if len(t.rows) == 1 {
		b.WriteString("(1 row)\n")
	} else {
		fmt.Fprintf(&b, "(%d rows)\n", len(t.rows))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
