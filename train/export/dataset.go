package export

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
)

// Rows is where dataset rows go: JSON objects whose top-level keys are
// columns.
type Rows interface {
	Write(row map[string]any) error
	Close() error
}

// JSONLines writes rows as JSON lines.
type JSONLines struct {
	w   *bufio.Writer
	enc *json.Encoder
}

// NewJSONLines writes to w (buffered; Close flushes).
func NewJSONLines(w io.Writer) *JSONLines {
	bw := bufio.NewWriterSize(w, 1<<20)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	return &JSONLines{w: bw, enc: enc}
}

func (j *JSONLines) Write(row map[string]any) error { return j.enc.Encode(row) }

// Close flushes.
func (j *JSONLines) Close() error { return j.w.Flush() }

// ParquetRows writes rows as a Parquet file whose schema is inferred from
// all the rows, the way a JSON loader (Hugging Face datasets, pyarrow)
// would: objects become structs with the union of their keys, arrays
// lists, integers int64, other numbers float64; a field seen with
// incompatible kinds (a string here, an array there) is kept as JSON text.
// Rows are spooled to a temporary file until Close, which infers nothing
// more and writes the file.
type ParquetRows struct {
	out     io.Writer
	columns []string // top-level order
	shapes  map[string]*shape
	spool   *os.File
	sw      *bufio.Writer
	rows    int64
	mem     memory.Allocator
}

// NewParquetRows writes to out; columns fixes the order of the top-level
// columns that appear (others follow, sorted).
func NewParquetRows(out io.Writer, columns []string) (*ParquetRows, error) {
	f, err := os.CreateTemp("", "rllm-export-*.jsonl")
	if err != nil {
		return nil, fmt.Errorf("export: spool: %w", err)
	}
	return &ParquetRows{out: out, columns: columns, shapes: map[string]*shape{}, spool: f, sw: bufio.NewWriterSize(f, 1<<20), mem: memory.DefaultAllocator}, nil
}

func (p *ParquetRows) Write(row map[string]any) error {
	for k, v := range row {
		s := p.shapes[k]
		if s == nil {
			s = &shape{}
			p.shapes[k] = s
		}
		s.observe(v)
	}
	data, err := json.Marshal(row)
	if err != nil {
		return fmt.Errorf("export: encode row: %w", err)
	}
	p.rows++
	if _, err := p.sw.Write(append(data, '\n')); err != nil {
		return fmt.Errorf("export: spool: %w", err)
	}
	return nil
}

// Close writes the Parquet file and removes the spool.
func (p *ParquetRows) Close() error {
	defer os.Remove(p.spool.Name())
	defer p.spool.Close()
	if err := p.sw.Flush(); err != nil {
		return fmt.Errorf("export: spool: %w", err)
	}
	var names []string
	seen := map[string]bool{}
	for _, c := range p.columns {
		if p.shapes[c] != nil {
			names = append(names, c)
			seen[c] = true
		}
	}
	var rest []string
	for c := range p.shapes {
		if !seen[c] {
			rest = append(rest, c)
		}
	}
	sort.Strings(rest)
	names = append(names, rest...)
	fields := make([]arrow.Field, len(names))
	for i, n := range names {
		fields[i] = arrow.Field{Name: n, Type: p.shapes[n].arrowType(), Nullable: true}
	}
	schema := arrow.NewSchema(fields, nil)
	w, err := parquet.NewWriter(p.out, schema, parquet.Options{Compact: true}, nil) // datasets: written once, read many times
	if err != nil {
		return err
	}
	b := array.NewRecordBuilder(p.mem, schema)
	defer b.Release()
	flush := func() error {
		rec := b.NewRecordBatch()
		defer rec.Release()
		if rec.NumRows() == 0 {
			return nil
		}
		return w.Write(rec)
	}
	if _, err := p.spool.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("export: spool: %w", err)
	}
	sc := bufio.NewScanner(p.spool)
	sc.Buffer(make([]byte, 1<<20), 1<<30)
	n := 0
	for sc.Scan() {
		d := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		d.UseNumber()
		var row map[string]any
		if err := d.Decode(&row); err != nil {
			return fmt.Errorf("export: spool: %w", err)
		}
		for i, name := range names {
			p.shapes[name].append(b.Field(i), row[name])
		}
		if n++; n%1024 == 0 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("export: spool: %w", err)
	}
	if err := flush(); err != nil {
		return err
	}
	return w.Close()
}

type kind uint8

const (
	kNull kind = iota
	kBool
	kInt
	kFloat
	kString
	kList
	kStruct
	kJSON // incompatible kinds: JSON text
)

// shape is the inferred type of a JSON value across rows.
type shape struct {
	k      kind
	elem   *shape
	fields map[string]*shape
	names  []string // sorted field names, cached once observation is over
}

func kindOf(v any) kind {
	switch x := v.(type) {
	case nil:
		return kNull
	case bool:
		return kBool
	case json.Number:
		if _, err := x.Int64(); err == nil {
			return kInt
		}
		return kFloat
	case float64:
		return kFloat
	case string:
		return kString
	case []any:
		return kList
	case map[string]any:
		return kStruct
	}
	return kJSON
}

func (s *shape) observe(v any) {
	k := kindOf(v)
	switch {
	case k == kNull:
		return
	case s.k == kJSON:
		return
	case s.k == kNull:
		s.k = k
	case s.k == k:
	case (s.k == kInt && k == kFloat) || (s.k == kFloat && k == kInt):
		s.k = kFloat
	default:
		s.k, s.elem, s.fields = kJSON, nil, nil
		return
	}
	switch s.k {
	case kList:
		if s.elem == nil {
			s.elem = &shape{}
		}
		for _, e := range v.([]any) {
			s.elem.observe(e)
		}
	case kStruct:
		if s.fields == nil {
			s.fields = map[string]*shape{}
		}
		for name, fv := range v.(map[string]any) {
			f := s.fields[name]
			if f == nil {
				f = &shape{}
				s.fields[name] = f
			}
			f.observe(fv)
		}
	}
}

func (s *shape) fieldNames() []string {
	if s.names != nil {
		return s.names
	}
	names := make([]string, 0, len(s.fields))
	for n := range s.fields {
		names = append(names, n)
	}
	sort.Strings(names)
	s.names = names
	return names
}

func (s *shape) arrowType() arrow.DataType {
	switch s.k {
	case kBool:
		return arrow.FixedWidthTypes.Boolean
	case kInt:
		return arrow.PrimitiveTypes.Int64
	case kFloat:
		return arrow.PrimitiveTypes.Float64
	case kList:
		return arrow.ListOf(s.elem.arrowType())
	case kStruct:
		names := s.fieldNames()
		fs := make([]arrow.Field, len(names))
		for i, n := range names {
			fs[i] = arrow.Field{Name: n, Type: s.fields[n].arrowType(), Nullable: true}
		}
		return arrow.StructOf(fs...)
	default: // null-only columns and JSON text are strings
		return arrow.BinaryTypes.String
	}
}

// append adds v, which observe has seen, to b (built from arrowType).
func (s *shape) append(b array.Builder, v any) {
	if v == nil {
		b.AppendNull()
		return
	}
	switch s.k {
	case kBool:
		b.(*array.BooleanBuilder).Append(v.(bool))
	case kInt:
		n, _ := v.(json.Number).Int64()
		b.(*array.Int64Builder).Append(n)
	case kFloat:
		var f float64
		switch x := v.(type) {
		case json.Number:
			f, _ = x.Float64()
		case float64:
			f = x
		}
		b.(*array.Float64Builder).Append(f)
	case kList:
		lb := b.(*array.ListBuilder)
		lb.Append(true)
		for _, e := range v.([]any) {
			s.elem.append(lb.ValueBuilder(), e)
		}
	case kStruct:
		sb := b.(*array.StructBuilder)
		sb.Append(true)
		m := v.(map[string]any)
		for i, n := range s.fieldNames() {
			s.fields[n].append(sb.FieldBuilder(i), m[n])
		}
	case kString:
		b.(*array.StringBuilder).Append(v.(string))
	default: // kJSON, or kNull never reached with a value
		if str, ok := v.(string); ok {
			b.(*array.StringBuilder).Append(str)
			return
		}
		data, _ := json.Marshal(v)
		b.(*array.StringBuilder).Append(string(data))
	}
}
