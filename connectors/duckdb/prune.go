package duckdb

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
)

// PruneDownloads removes from the kept download folder of a remote
// opening (Options.DownloadDir) every file under its shards/ and
// compacted/ folders that d's views do not read: what earlier openings
// left there (shards since merged into compacted files, older compaction
// snapshots, downloads cut short). A long-lived reader of an S3 output
// that reopens its views over one folder (the live view) calls it once
// the views it replaced are closed: nothing else may read or download
// into the folder meanwhile. Without a kept folder (or for a local
// output) it does nothing. It returns the files removed; a file it
// cannot remove is reported and the others still go.
func (d *DB) PruneDownloads() (int, error) {
	if d.kept == "" || d.layout == nil {
		return 0, nil
	}
	l := d.layout
	keep := map[string]bool{}
	for _, s := range slices.Concat(l.shards, l.snapMerged) {
		keep[filepath.Clean(s.file)] = true
	}
	if l.snap != nil {
		keep[filepath.Clean(l.snap.file)] = true
	}
	var removed int
	var errs []error
	for _, sub := range []string{"shards", "compacted"} {
		top := filepath.Join(d.kept, sub)
		var dirs []string
		// The walk never stops: its errors are gathered in errs.
		_ = filepath.WalkDir(top, func(path string, e fs.DirEntry, err error) error {
			switch {
			case err != nil:
				if !errors.Is(err, fs.ErrNotExist) || path != top {
					errs = append(errs, err)
				}
				return nil // the rest of the walk goes on
			case e.IsDir():
				dirs = append(dirs, path)
			case !keep[path]:
				if err := os.Remove(path); err != nil {
					errs = append(errs, err)
				} else {
					removed++
				}
			}
			return nil
		})
		// Folders left empty (a policy's shards all merged) go too;
		// the others refuse.
		for _, dir := range slices.Backward(dirs[min(1, len(dirs)):]) {
			_ = os.Remove(dir)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("duckdb: pruning the download folder: %w", err)
	}
	return removed, nil
}
