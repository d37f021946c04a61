package iceberg

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/rllm-pipe/rllm-pipe/connectors"
)

// Locations are where a root's tables live, as a catalog names them.
type Locations struct {
	// Base is the URL prefix of the root's files (Config.Base).
	Base string
	// Warehouse is where new tables keep their metadata.
	Warehouse string
	// Props are the catalog's file IO properties: for S3 the endpoint,
	// region and keys (from the environment, as the store's).
	Props map[string]string
}

// LocationsOf returns root's locations; warehouse, when empty, is the
// root's _iceberg folder, and a local path is made absolute.
func LocationsOf(root connectors.Root, warehouse string) (Locations, error) {
	if root.S3 == nil {
		abs, err := filepath.Abs(root.Path)
		if err != nil {
			return Locations{}, fmt.Errorf("iceberg: the root's path: %w", err)
		}
		base := "file://" + filepath.ToSlash(abs) + "/"
		switch {
		case warehouse == "":
			warehouse = base + "_iceberg"
		case !strings.Contains(warehouse, "://"):
			w, err := filepath.Abs(warehouse)
			if err != nil {
				return Locations{}, fmt.Errorf("iceberg: the warehouse's path: %w", err)
			}
			warehouse = "file://" + filepath.ToSlash(w)
		}
		return Locations{Base: base, Warehouse: warehouse}, nil
	}
	c := root.S3
	base := "s3://" + c.Bucket + "/"
	if c.Prefix != "" {
		base += c.Prefix + "/"
	}
	if warehouse == "" {
		warehouse = base + "_iceberg"
	}
	props := map[string]string{"s3.endpoint": c.Endpoint, "s3.region": c.Region, "s3.access-key-id": c.AccessKey,
		"s3.secret-access-key": c.SecretKey, "s3.force-virtual-addressing": "false"}
	return Locations{Base: base, Warehouse: warehouse, Props: props}, nil
}
