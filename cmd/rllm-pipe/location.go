package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/connectors"
	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/train/export"

	"github.com/rllm-pipe/rllm-pipe/cmd/internal/cli"
)

// localPath resolves a --from/--to/--dlq URL of the embedded default:
// file:///path, a plain path, or "-" (stdin, for --from only).
func localPath(flag, raw string) (string, error) {
	if raw == "" {
		return "", usageErrorf("--%s is required", flag)
	}
	if raw == "-" {
		return raw, nil
	}
	p, err := connectors.LocalPath(raw)
	if err != nil {
		return "", usageErrorf("--%s %v", flag, err)
	}
	return p, nil
}

var parseBytes = cli.ParseBytes

// checkOutputFiles refuses, as a usage error (exit 2), file outputs that
// would write into a store: outputs holds flag name, path pairs (an empty
// path, "-" or a URL is skipped). A path is checked (export.CheckOutput:
// the root itself, its reserved "_" folders such as _manifest and _dlq, a
// shard) against every local root in roots (the outputs the command reads
// or writes; s3:// and kafka:// ones are skipped, and a root need not
// exist yet) and against every store the path lies in: each folder above
// it, symbolic links resolved, that holds a _manifest folder. report's
// --out, consume's --out, ingest's --stats-json and the like call it
// before they write anything.
func checkOutputFiles(ctx context.Context, roots []string, outputs ...string) error {
	var local []string
	for _, r := range roots {
		if p, ok := localRootPath(r); ok {
			local = append(local, p)
		}
	}
	for i := 0; i+1 < len(outputs); i += 2 {
		flag, path := outputs[i], outputs[i+1]
		if path == "" || path == "-" || strings.Contains(path, "://") {
			continue
		}
		candidates := append(slices.Clone(local), enclosingStores(path)...)
		for _, root := range candidates {
			if err := export.CheckOutput(ctx, manifestRoot(root), path); err != nil {
				if errors.Is(err, export.ErrOutputInStore) {
					return &exitError{Code: exitUsage, Err: fmt.Errorf("--%s: %w", flag, err)}
				}
				return fmt.Errorf("--%s: %w", flag, err)
			}
		}
	}
	return nil
}

// localRootPath is the folder of a local root URL (a path or file:///).
func localRootPath(raw string) (string, bool) {
	if raw == "" || raw == "-" || (strings.Contains(raw, "://") && !strings.HasPrefix(raw, "file://")) {
		return "", false
	}
	p, err := connectors.LocalPath(raw)
	if err != nil {
		return "", false
	}
	return p, true
}

// enclosingStores returns the folders above path that hold a _manifest
// folder (store roots), both as written and with the existing part's
// symbolic links resolved.
func enclosingStores(path string) []string {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil
	}
	starts := []string{filepath.Dir(abs)}
	// The longest existing folder above it, links resolved.
	for d := filepath.Dir(abs); ; d = filepath.Dir(d) {
		if r, err := filepath.EvalSymlinks(d); err == nil {
			if r != d {
				starts = append(starts, r)
			}
			break
		}
		if d == filepath.Dir(d) {
			break
		}
	}
	var out []string
	for _, s := range starts {
		for d := s; ; d = filepath.Dir(d) {
			if info, err := os.Stat(filepath.Join(d, "_manifest")); err == nil && info.IsDir() && !slices.Contains(out, d) {
				out = append(out, d)
			}
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	return out
}

// manifestRoot is a local root as export.CheckOutput reads it: its folder
// and its manifest (none yet: no entries).
type manifestRoot string

func (r manifestRoot) Root() string { return string(r) }

func (r manifestRoot) Committed(context.Context) ([]schemas.ShardEntry, error) {
	if _, err := os.Stat(filepath.Join(string(r), "_manifest")); err != nil {
		return nil, nil
	}
	entries, err := local.ReadManifest(string(r))
	if err != nil {
		return nil, nil // an unreadable manifest: the folder checks still hold
	}
	return slices.DeleteFunc(entries, func(e schemas.ShardEntry) bool { return e.Path == "" }), nil
}

func (r manifestRoot) ReadShard(context.Context, schemas.ShardEntry, []string, memory.Allocator) (*parquet.Reader, error) {
	return nil, errors.New("not a reader")
}
