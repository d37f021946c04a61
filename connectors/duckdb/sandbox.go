package duckdb

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	duckdbdrv "github.com/duckdb/duckdb-go/v2"
)

// ErrRefused marks a query the read-only sandbox refused: a statement
// that is not a query (COPY, ATTACH, INSTALL, SET, CREATE, ...), several
// statements at once, or access to a file or the network beyond the
// committed data the views read. Options.AllowHostFiles lifts it.
var ErrRefused = errors.New("refused")

// sandbox confines DuckDB to the files the views read, once the views
// exist (they bind lazily, so the files must stay reachable):
//
//   - allowed_paths lists exactly those files and enable_external_access
//     is off, so every other path (a host file, a glob, the manifest, a
//     database to ATTACH, the extension and secret folders) and every URL
//     is refused, for reading and for writing;
//   - no extension is installed or loaded (the embedded build links
//     parquet and json in);
//   - lock_configuration forbids any later SET, RESET or PRAGMA that
//     changes a setting, so a query cannot undo the above.
//
// The listed files can still be written by DuckDB (COPY … TO a shard
// with USE_TMP_FILE false succeeds), which is why Query also refuses
// every statement that is not a query (readOnly). Spilling to
// temp_directory is internal and keeps working.
func (d *DB) sandbox(ctx context.Context, conn *sql.Conn, l *layout) error {
	// allowed_paths is set from a variable of conn's, filled from the
	// shards table: a literal list of every file costs DuckDB a parse
	// that grows with the run.
	dlq := make([]string, 0, len(l.dlq))
	for _, f := range l.dlq {
		dlq = append(dlq, sqlString(f.file))
	}
	files := "coalesce((SELECT list(DISTINCT file) FROM shards), []::VARCHAR[])"
	if l.snap != nil {
		// The files the views read, and the snapshot the shards view reads.
		files = "coalesce((SELECT list(DISTINCT file) FROM " + viewFiles + "), []::VARCHAR[]) || [" + sqlString(l.snap.file) + "]"
	}
	for _, set := range []string{
		"SET VARIABLE rllm_allowed_paths = " + files + " || [" + strings.Join(dlq, ", ") + "]::VARCHAR[]",
		"SET GLOBAL allowed_directories = []",
		"SET GLOBAL allowed_paths = getvariable('rllm_allowed_paths')",
		"RESET VARIABLE rllm_allowed_paths",
		"SET GLOBAL enable_external_access = false",
		"SET GLOBAL autoinstall_known_extensions = false",
		"SET GLOBAL autoload_known_extensions = false",
		"SET GLOBAL allow_community_extensions = false",
		"SET GLOBAL lock_configuration = true",
	} {
		if _, err := conn.ExecContext(ctx, set); err != nil {
			return fmt.Errorf("duckdb: sandbox: %s: %w", clipSQL(set), err)
		}
	}
	return nil
}

func clipSQL(s string) string {
	if len(s) > 80 {
		return s[:77] + "..."
	}
	return s
}

// readOnly refuses q unless it is one query: a SELECT (which covers
// FROM, WITH, VALUES, TABLE, DESCRIBE, SHOW, SUMMARIZE, PRAGMA table
// functions and PIVOT with an IN list), or an EXPLAIN [ANALYZE] of one
// (EXPLAIN ANALYZE runs the statement it explains, so the explained
// statement is checked too). The statement is only prepared here, never
// run; preparing binds it, so a refused file access fails here already.
// With checkPlan the query's plan is also searched for stateFunctions
// (noStateFunctions). Query skips that for a query with arguments: its
// text is the program's own (a user's values are parameters, which call
// nothing), and serialising the views' whole plan is work every page of
// the ui would repeat (docs/sql.md#sql-is-read-only has its cost).
func (d *DB) readOnly(ctx context.Context, q string, checkPlan bool) error {
	typ, err := d.statementType(ctx, q)
	if err != nil {
		return err
	}
	switch typ {
	case duckdbdrv.STATEMENT_TYPE_SELECT:
		if !checkPlan {
			return nil
		}
		return d.noStateFunctions(ctx, q)
	case duckdbdrv.STATEMENT_TYPE_EXPLAIN:
		inner, ok := explained(q)
		if !ok {
			return fmt.Errorf("%w: EXPLAIN: only EXPLAIN [ANALYZE] followed by a query runs here", ErrRefused)
		}
		it, err := d.statementType(ctx, inner)
		if err != nil || it != duckdbdrv.STATEMENT_TYPE_SELECT {
			return fmt.Errorf("%w: EXPLAIN: only EXPLAIN [ANALYZE] followed by a query runs here", ErrRefused)
		}
		if !checkPlan {
			return nil
		}
		return d.noStateFunctions(ctx, inner)
	}
	return fmt.Errorf("%w: %s statements are not allowed: sql is read only (queries only)", ErrRefused, stmtName(typ))
}

// stateFunctions are DuckDB's functions that change the database from
// inside a query, where lock_configuration does not reach (they are
// functions, not SET): logging (to stdout it prints record text past the
// table format's escaping) and its settings, profiling, checkpoints, the
// random seed.
var stateFunctions = []string{"enable_logging", "disable_logging", "truncate_duckdb_logs", "write_log",
	"enable_profiling", "enable_profile", "disable_profiling", "disable_profile",
	"checkpoint", "force_checkpoint", "enable_checkpoint_on_shutdown", "disable_checkpoint_on_shutdown", "setseed"}

// textRunners are the table functions that run SQL text computed at bind
// time, where a call of a state function can hide from a look at the
// query's own text.
var textRunners = []string{"query", "query_table", "json_execute_serialized_sql"}

// unplannedWords are the names a query whose plan cannot be serialised
// must not hold.
var unplannedWords = slices.Concat(stateFunctions, textRunners)

// noStateFunctions refuses a query that calls one of stateFunctions. It
// looks at the query's bound plan (json_serialize_plan, which binds but
// does not run it), so that a call inside the text query() builds at
// bind time (query(concat('… ena', 'ble_logging()'))) is found too. Some
// plans cannot be serialised (those reading JSON: the dead_letters view);
// for them the query's text must name neither a state function nor a
// function that runs computed text.
func (d *DB) noStateFunctions(ctx context.Context, q string) error {
	var plan string
	if err := d.db.QueryRowContext(ctx, "SELECT json_serialize_plan("+sqlString(q)+")::VARCHAR").Scan(&plan); err != nil {
		return classify(err)
	}
	var head struct {
		Error bool `json:"error"`
	}
	if err := json.Unmarshal([]byte(plan), &head); err != nil || head.Error {
		text := strings.ToLower(q)
		for _, f := range unplannedWords {
			if containsWord(text, f) {
				return fmt.Errorf("%w: %s: not allowed in a query whose plan cannot be checked (one that reads dead_letters): sql is read only", ErrRefused, f)
			}
		}
		return nil
	}
	for _, f := range stateFunctions {
		if strings.Contains(plan, `"name":"`+f+`"`) {
			return fmt.Errorf("%w: %s changes the database's state: sql is read only", ErrRefused, f)
		}
	}
	return nil
}

// containsWord says whether w occurs in s between characters that cannot
// continue an identifier.
func containsWord(s, w string) bool {
	ident := func(i int) bool {
		if i < 0 || i >= len(s) {
			return false
		}
		c := s[i]
		return c == '_' || c == '$' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c >= 0x80
	}
	for off := 0; ; {
		i := strings.Index(s[off:], w)
		if i < 0 {
			return false
		}
		i += off
		if !ident(i-1) && !ident(i+len(w)) {
			return true
		}
		off = i + 1
	}
}

// statementType prepares q on a connection of its own, without running
// it. The driver's Prepare refuses text holding several statements
// (PrepareContext would run all but the last).
func (d *DB) statementType(ctx context.Context, q string) (duckdbdrv.StmtType, error) {
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return 0, fmt.Errorf("duckdb: connection: %w", err)
	}
	defer conn.Close()
	var typ duckdbdrv.StmtType
	err = conn.Raw(func(dc any) error {
		c, ok := dc.(*duckdbdrv.Conn)
		if !ok {
			return fmt.Errorf("duckdb: unexpected driver connection %T", dc)
		}
		st, err := c.Prepare(q)
		if err != nil {
			return err
		}
		defer st.Close()
		s, ok := st.(*duckdbdrv.Stmt)
		if !ok {
			return fmt.Errorf("duckdb: unexpected driver statement %T", st)
		}
		typ, err = s.StatementType()
		return err
	})
	if err != nil {
		var de *duckdbdrv.Error
		if !errors.As(err, &de) && strings.Contains(err.Error(), "multi-statement") {
			return 0, fmt.Errorf("%w: one statement at a time (PIVOT needs an explicit IN list)", ErrRefused)
		}
		return 0, classify(err)
	}
	return typ, nil
}

// stmtName names a statement type in messages.
func stmtName(t duckdbdrv.StmtType) string {
	switch t {
	case duckdbdrv.STATEMENT_TYPE_INSERT:
		return "INSERT"
	case duckdbdrv.STATEMENT_TYPE_UPDATE:
		return "UPDATE"
	case duckdbdrv.STATEMENT_TYPE_DELETE:
		return "DELETE"
	case duckdbdrv.STATEMENT_TYPE_PREPARE:
		return "PREPARE"
	case duckdbdrv.STATEMENT_TYPE_CREATE, duckdbdrv.STATEMENT_TYPE_CREATE_FUNC:
		return "CREATE"
	case duckdbdrv.STATEMENT_TYPE_EXECUTE:
		return "EXECUTE"
	case duckdbdrv.STATEMENT_TYPE_ALTER:
		return "ALTER"
	case duckdbdrv.STATEMENT_TYPE_TRANSACTION:
		return "transaction"
	case duckdbdrv.STATEMENT_TYPE_COPY:
		return "COPY"
	case duckdbdrv.STATEMENT_TYPE_ANALYZE:
		return "ANALYZE"
	case duckdbdrv.STATEMENT_TYPE_VARIABLE_SET, duckdbdrv.STATEMENT_TYPE_SET:
		return "SET"
	case duckdbdrv.STATEMENT_TYPE_DROP:
		return "DROP"
	case duckdbdrv.STATEMENT_TYPE_EXPORT:
		return "EXPORT"
	case duckdbdrv.STATEMENT_TYPE_PRAGMA:
		return "PRAGMA"
	case duckdbdrv.STATEMENT_TYPE_VACUUM:
		return "VACUUM"
	case duckdbdrv.STATEMENT_TYPE_CALL:
		return "CALL (use SELECT * FROM f())"
	case duckdbdrv.STATEMENT_TYPE_LOAD, duckdbdrv.STATEMENT_TYPE_EXTENSION:
		return "INSTALL/LOAD"
	case duckdbdrv.STATEMENT_TYPE_ATTACH:
		return "ATTACH"
	case duckdbdrv.STATEMENT_TYPE_DETACH:
		return "DETACH"
	}
	return fmt.Sprintf("type %d", t)
}

// explained returns the statement after a leading EXPLAIN [ANALYZE]. It
// skips whitespace and comments as DuckDB's lexer does (line comments end
// at a newline or carriage return, block comments nest); any doubt leaves
// text that does not prepare as a query, so the statement is refused.
func explained(q string) (string, bool) {
	s, ok := cutWord(skipBlank(q), "explain")
	if !ok {
		return "", false
	}
	s = skipBlank(s)
	if rest, ok := cutWord(s, "analyze"); ok {
		s = rest
	} else if rest, ok := cutWord(s, "analyse"); ok {
		s = rest
	}
	return s, true
}

// skipBlank drops leading ASCII whitespace and SQL comments.
func skipBlank(s string) string {
	for {
		s = strings.TrimLeft(s, " \t\n\r\f\v")
		switch {
		case strings.HasPrefix(s, "--"):
			i := strings.IndexAny(s, "\n\r")
			if i < 0 {
				return ""
			}
			s = s[i+1:]
		case strings.HasPrefix(s, "/*"):
			depth, i := 1, 2
			for depth > 0 {
				if i+1 >= len(s) {
					return ""
				}
				switch s[i : i+2] {
				case "/*":
					depth++
					i += 2
				case "*/":
					depth--
					i += 2
				default:
					i++
				}
			}
			s = s[i:]
		default:
			return s
		}
	}
}

// cutWord removes the keyword w (ASCII, any case) from the front of s
// when it is a whole word.
func cutWord(s, w string) (string, bool) {
	if len(s) < len(w) || !strings.EqualFold(s[:len(w)], w) {
		return s, false
	}
	rest := s[len(w):]
	if r, _ := utf8.DecodeRuneInString(rest); rest != "" && (r == '_' || r == '$' || r >= utf8.RuneSelf || unicode.IsLetter(r) || unicode.IsDigit(r)) {
		return s, false
	}
	return rest, true
}
