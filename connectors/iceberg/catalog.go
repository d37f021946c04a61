package iceberg

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/apache/iceberg-go"
	"github.com/apache/iceberg-go/catalog"
	"github.com/apache/iceberg-go/catalog/rest"
	sqlcat "github.com/apache/iceberg-go/catalog/sql"
	_ "github.com/apache/iceberg-go/io/gocloud" // s3:// warehouses and shards
	_ "github.com/jackc/pgx/v5/stdlib"          // the SQL catalog on PostgreSQL
	_ "modernc.org/sqlite"                      // the SQL catalog's embedded default
)

// Catalog is an open Iceberg catalog and what closes it.
type Catalog struct {
	catalog.Catalog
	close func() error
}

// Close releases the catalog's connections.
func (c *Catalog) Close() error {
	if c.close == nil {
		return nil
	}
	return c.close()
}

// ErrCatalogURI is a catalog URI of no kind OpenCatalog knows.
var ErrCatalogURI = errors.New("iceberg: catalog URI")

// DefaultCatalogName is the catalog's name where the catalog stores it
// (the SQL catalog's catalog_name column): readers configure the same
// name (pyiceberg's SqlCatalog("rllm", ...), Spark's
// spark.sql.catalog.rllm).
const DefaultCatalogName = "rllm"

// OpenCatalog opens the catalog a URI names:
//
//   - a SQLite file: sqlite:///abs/path.db, sqlite:rel/path.db, or a
//     path ending in .db, .sqlite or .sqlite3 (created with its tables if
//     absent: the embedded default, no service);
//   - the SQL catalog on PostgreSQL: postgres://user@host:port/db (the
//     password from PGPASSWORD in the environment, as libpq reads it;
//     the catalog's tables are created if absent);
//   - a REST catalog: http:// or https:// (a bearer token from
//     ICEBERG_REST_TOKEN in the environment, when set).
//
// props are the catalog's properties (the warehouse, the S3 settings of
// its file IO).
func OpenCatalog(ctx context.Context, uri, name string, props iceberg.Properties) (*Catalog, error) {
	if name == "" {
		name = DefaultCatalogName
	}
	if path, ok := sqlitePath(uri); ok {
		return openSQLite("sqlite", path, name, props)
	}
	u, err := url.Parse(uri)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCatalogURI, err)
	}
	switch u.Scheme {
	case "postgres", "postgresql":
		return openPostgres(uri, u, name, props)
	case "http", "https":
		opts := []rest.Option{rest.WithAdditionalProps(props)}
		if w := props["warehouse"]; w != "" {
			opts = append(opts, rest.WithWarehouseLocation(w))
		}
		if tok := os.Getenv("ICEBERG_REST_TOKEN"); tok != "" {
			opts = append(opts, rest.WithOAuthToken(tok))
		}
		c, err := rest.NewCatalog(ctx, name, uri, opts...)
		if err != nil {
			return nil, fmt.Errorf("iceberg: REST catalog %s: %w", u.Redacted(), err)
		}
		return &Catalog{Catalog: c, close: c.Close}, nil
	}
	return nil, fmt.Errorf("%w: %q: want a SQLite file (sqlite:///path.db or a path ending in .db), postgres://... or a REST catalog (http:// or https://)", ErrCatalogURI, u.Redacted())
}

// sqlitePath reads a SQLite catalog URI.
func sqlitePath(uri string) (string, bool) {
	if rest, ok := strings.CutPrefix(uri, "sqlite://"); ok {
		return rest, rest != ""
	}
	if rest, ok := strings.CutPrefix(uri, "sqlite:"); ok {
		return rest, rest != ""
	}
	if strings.Contains(uri, "://") {
		return "", false
	}
	switch strings.ToLower(filepath.Ext(uri)) {
	case ".db", ".sqlite", ".sqlite3":
		return uri, true
	}
	return "", false
}

// openSQLite opens the SQL catalog on the SQLite file at path through the
// database/sql driver named driverName.
func openSQLite(driverName, path, name string, props iceberg.Properties) (*Catalog, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("iceberg: catalog folder: %w", err)
	}
	// WAL and a busy timeout on every pooled connection: syncers and
	// readers (pyiceberg, Spark's JDBC catalog) share the file.
	dsn := "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)"
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		return nil, fmt.Errorf("iceberg: open %s: %w", path, err)
	}
	p := iceberg.Properties{"init_catalog_tables": "true"}
	for k, v := range props {
		p[k] = v
	}
	c, err := newSQLCatalog(name, db, sqlcat.SQLite, p)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("iceberg: SQL catalog %s: %w", path, err), db.Close())
	}
	return &Catalog{Catalog: c, close: func() error { return errors.Join(c.Close(), db.Close()) }}, nil
}

// openPostgres opens the SQL catalog on PostgreSQL.
func openPostgres(uri string, u *url.URL, name string, props iceberg.Properties) (*Catalog, error) {
	db, err := sql.Open("pgx", uri)
	if err != nil {
		return nil, fmt.Errorf("iceberg: open %s: %w", u.Redacted(), err)
	}
	p := iceberg.Properties{"init_catalog_tables": "true"}
	for k, v := range props {
		p[k] = v
	}
	c, err := newSQLCatalog(name, db, sqlcat.Postgres, p)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("iceberg: SQL catalog %s: %w", u.Redacted(), err), db.Close())
	}
	return &Catalog{Catalog: c, close: func() error { return errors.Join(c.Close(), db.Close()) }}, nil
}

// newSQLCatalog opens the SQL catalog, creating its tables if absent.
// Catalogs opened at once race to create them (PostgreSQL's CREATE TABLE
// IF NOT EXISTS is not safe against a concurrent one; SQLite's switch to
// WAL is refused while another connection holds the file): the loser
// tries again, and finds them.
func newSQLCatalog(name string, db *sql.DB, d sqlcat.SupportedDialect, props iceberg.Properties) (*sqlcat.Catalog, error) {
	for attempt := 0; ; attempt++ {
		c, err := sqlcat.NewCatalog(name, db, d, props)
		if err == nil || attempt == 7 || !racedCreate(err) {
			return c, err
		}
		time.Sleep(time.Duration(attempt+1) * 50 * time.Millisecond)
	}
}

// racedCreate reports whether err is a catalog's tables' creation lost
// to a concurrent one.
func racedCreate(err error) bool {
	msg := err.Error()
	for _, m := range []string{"duplicate key", "already exists", "database is locked", "SQLITE_BUSY"} {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}
