package iceberg

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apache/iceberg-go"
)

// TestIntegrationRESTCatalog: the syncers' race (TestSyncersRace) over a
// real Iceberg REST catalog: Apache Iceberg's REST catalog fixture, the
// JDBC catalog on SQLite behind it, which scripts/services.sh starts
// (RLLM_ICEBERG_REST_URL). The server decides where the table lives (in
// its own warehouse) and writes its metadata files there; the client
// writes the manifests next to them and the shards stay where the root
// has them, at file:// paths on the same machine.
func TestIntegrationRESTCatalog(t *testing.T) {
	uri := os.Getenv("RLLM_ICEBERG_REST_URL")
	if uri == "" {
		t.Skip("RLLM_ICEBERG_REST_URL not set: run `make test` (it starts the Iceberg REST catalog)")
	}
	ctx := context.Background()
	dir := t.TempDir()
	var b [4]byte
	_, _ = rand.Read(b[:])
	ns := "test_" + hex.EncodeToString(b[:])
	open := func() *Catalog {
		c, err := OpenCatalog(ctx, uri, "", iceberg.Properties{"warehouse": "file://" + filepath.Join(dir, "warehouse")})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// The syncers race to create the namespace too.
	syncersRace(t, dir, open, ns)
	cat := open()
	defer cat.Close()
	tbl, err := cat.LoadTable(ctx, []string{ns, StepsTable})
	if err != nil {
		t.Fatal(err)
	}
	if loc := tbl.Location(); !strings.HasSuffix(loc, "/"+ns+"/"+StepsTable) || strings.HasPrefix(loc, "file://"+dir) {
		t.Errorf("the table is at %s; want it in the server's warehouse, at <warehouse>/%s/%s", loc, ns, StepsTable)
	}
}
