package export

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/rllm-pipe/rllm-pipe/train"
)

// ErrOutputInStore marks an output path that would write into the store
// an export reads: see CheckOutput.
var ErrOutputInStore = errors.New("output inside the store")

// CheckOutput refuses an output file path that would write into the local
// output root src reads (src has a Root, as a local reader does; an
// object store has no local root and passes): the root itself, anything
// under a folder of the root whose name starts with "_" (the store's
// own: _manifest, _dlq, _tmp, _groups, ...), a committed shard, or an
// existing Parquet file under the root (a shard a writer may be
// committing). Both paths are made absolute and their symbolic links
// resolved first, component by component as the operating system would
// (a ".." after a link goes to the parent of the link's target), so that
// neither a relative path nor a link leads around the check. Other files
// under the root are allowed: readers ignore what the manifest does not
// list. The error wraps ErrOutputInStore.
func CheckOutput(ctx context.Context, src train.Shards, path string) error {
	l, ok := src.(interface{ Root() string })
	if !ok || path == "" {
		return nil
	}
	root, err := resolvePath(l.Root())
	if err != nil {
		return fmt.Errorf("resolve output root %s: %w", l.Root(), err)
	}
	out, err := resolvePath(path)
	if err != nil {
		return fmt.Errorf("resolve %s: %w", path, err)
	}
	rel, err := filepath.Rel(root, out)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return nil // outside the root
	}
	refuse := func(what string) error {
		return fmt.Errorf("%w: %s (%s) is %s of %s; write it elsewhere", ErrOutputInStore, path, out, what, root)
	}
	if rel == "." {
		return refuse("the output root")
	}
	if first, _, _ := strings.Cut(rel, string(filepath.Separator)); strings.HasPrefix(first, "_") {
		return refuse("inside " + first + ", a reserved folder")
	}
	if strings.EqualFold(filepath.Ext(out), ".parquet") {
		if _, err := os.Stat(out); err == nil {
			return refuse("a shard")
		}
	}
	entries, err := src.Committed(ctx)
	if err != nil {
		return fmt.Errorf("check output %s: %w", path, err)
	}
	for _, e := range entries {
		if e.Path != "" && filepath.FromSlash(e.Path) == rel {
			return refuse("a committed shard")
		}
	}
	return nil
}

// resolvePath makes p absolute and resolves the symbolic links of its
// existing part component by component, as the operating system walks
// it; the part that does not exist yet is joined as written.
func resolvePath(p string) (string, error) {
	if !filepath.IsAbs(p) {
		wd, err := os.Getwd()
		if err != nil {
			return "", err
		}
		p = wd + string(filepath.Separator) + p
	}
	cur := filepath.VolumeName(p) + string(filepath.Separator)
	exists := true
	for _, c := range strings.Split(p[len(filepath.VolumeName(p)):], string(filepath.Separator)) {
		switch c {
		case "", ".":
			continue
		case "..":
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, c)
		if !exists {
			cur = next
			continue
		}
		info, err := os.Lstat(next)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			exists = false
			cur = next
		case err != nil:
			return "", err
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := filepath.EvalSymlinks(next)
			if errors.Is(err, fs.ErrNotExist) {
				// A dangling link: writing through it creates its target.
				link, err := os.Readlink(next)
				if err != nil {
					return "", err
				}
				if !filepath.IsAbs(link) {
					link = cur + string(filepath.Separator) + link
				}
				if target, err = resolvePath(link); err != nil {
					return "", err
				}
				exists = false
			} else if err != nil {
				return "", err
			}
			cur = target
		default:
			cur = next
		}
	}
	return cur, nil
}
