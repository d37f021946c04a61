// Package report turns the committed data of an output root into charts:
// it runs the named reports of `rllm-pipe sql --report` (the same queries,
// nothing else) and draws them as inline SVG, for one self-contained HTML
// file (`rllm-pipe report`) and for the live view (package live).
//
// The charts are drawn in Go, not by a JavaScript library: the page then
// needs no script at all (it opens offline and makes no request: its
// Content-Security-Policy forbids any), its size depends on the number of
// buckets, never on the number of rows, and tests read the figures
// straight from the SVG's data attributes.
package report

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"math/big"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb"
)

// Querier runs a query; *duckdb.DB is one.
type Querier interface {
	Query(ctx context.Context, q string, args ...any) (*sql.Rows, error)
}

// Table is the result of one named report.
type Table struct {
	Name    string
	Columns []string
	Rows    [][]any
}

// Col returns the index of the named column, or -1.
func (t *Table) Col(name string) int {
	for i, c := range t.Columns {
		if c == name {
			return i
		}
	}
	return -1
}

// Data is what the charts are drawn from: one table per report.
type Data struct {
	Source    string
	Generated time.Time
	Shards    int
	Ks        []int
	Tables    map[string]*Table
}

// Names lists the reports Collect runs, in order.
func Names() []string {
	return []string{
		duckdb.ReportRewardByVersion, duckdb.ReportPassAtKByVersion, duckdb.ReportPassAtK, duckdb.ReportStaleness,
		duckdb.ReportAdvantage, duckdb.ReportAdvantageHistogram, duckdb.ReportTokenLengths, duckdb.ReportLengthsByVersion,
		duckdb.ReportFilteredByVersion, duckdb.ReportFilteredOverTime, duckdb.ReportDeadLetters,
		duckdb.ReportDeadLettersOverTime, duckdb.ReportThroughput, duckdb.ReportRoles, duckdb.ReportTrainingLoop, duckdb.ReportStaleSkips, duckdb.ReportPromptForks,
	}
}

// maxRows bounds what one report may hand to the page (pass-at-k has a
// row per task; only its mean row is drawn).
const maxRows = 100_000

// Collect runs every report of Names over q.
func Collect(ctx context.Context, q Querier, o duckdb.ReportOptions) (*Data, error) {
	d := &Data{Tables: map[string]*Table{}, Generated: time.Now().UTC(), Ks: o.K}
	if len(d.Ks) == 0 {
		d.Ks = []int{1, 2, 4, 8}
	}
	o.K = d.Ks
	for _, name := range Names() {
		text, err := duckdb.Report(name, o)
		if err != nil {
			return nil, fmt.Errorf("report %s: %w", name, err)
		}
		t, err := RunTable(ctx, q, name, text)
		if err != nil {
			return nil, err
		}
		d.Tables[name] = t
	}
	return d, nil
}

// RunTable runs one query and reads its rows (at most maxRows kept).
func RunTable(ctx context.Context, q Querier, name, text string, args ...any) (*Table, error) {
	rows, err := q.Query(ctx, text, args...)
	if err != nil {
		return nil, fmt.Errorf("report %s: %w", name, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, fmt.Errorf("report %s: %w", name, err)
	}
	t := &Table{Name: name, Columns: cols}
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, fmt.Errorf("report %s: %w", name, err)
		}
		for i, v := range vals {
			vals[i] = normalise(v)
		}
		if len(t.Rows) < maxRows {
			t.Rows = append(t.Rows, vals)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("report %s: %w", name, err)
	}
	return t, nil
}

// normalise maps the driver's values to int64, float64, string, bool,
// time.Time or nil.
func normalise(v any) any {
	switch x := v.(type) {
	case int8:
		return int64(x)
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case uint8:
		return int64(x)
	case uint16:
		return int64(x)
	case uint32:
		return int64(x)
	case uint64:
		return float64(x)
	case float32:
		return float64(x)
	case *big.Int:
		if x.IsInt64() {
			return x.Int64()
		}
		f, _ := new(big.Float).SetInt(x).Float64()
		return f
	case []byte:
		return string(x)
	}
	return v
}

// Num reads v as a number; ok is false for NULL, NaN and non-numbers.
func Num(v any) (float64, bool) {
	switch x := v.(type) {
	case int64:
		return float64(x), true
	case int:
		return float64(x), true
	case float64:
		return x, !math.IsNaN(x) && !math.IsInf(x, 0)
	case time.Time:
		return float64(x.UnixNano()) / 1e9, true
	}
	return 0, false
}

// Str reads v as text.
func Str(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case time.Time:
		return x.UTC().Format(time.RFC3339)
	}
	return fmt.Sprint(v)
}
