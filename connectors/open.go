package connectors

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/s3"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
)

// Root is an output root named by a URL: a local directory (a path or
// file:///path) or an S3 prefix (s3://bucket/prefix).
type Root struct {
	Path string     // the local directory, if local
	S3   *s3.Config // the bucket and prefix, if S3
}

// Options complete a root's location; settings left empty come from the
// environment (AWS_ENDPOINT_URL, AWS_REGION, ...). Credentials come only
// from the environment or the standard AWS files.
type Options struct {
	S3Endpoint string
	S3Region   string
	// RetryFor bounds how long an S3 operation is retried through an
	// outage (0: s3.DefaultRetryFor).
	RetryFor time.Duration
}

// ParseRoot reads an output root's URL. "-" (stdin) is no root.
func ParseRoot(raw string, o Options) (Root, error) {
	var r Root
	switch {
	case raw == "":
		return r, fmt.Errorf("no output root given")
	case raw == "-":
		return r, fmt.Errorf("%q: shards cannot live on stdin or stdout", raw)
	case strings.HasPrefix(raw, "s3://"):
		cfg, err := s3.ParseURL(raw)
		if err != nil {
			return r, err
		}
		if o.S3Endpoint != "" {
			cfg.Endpoint = o.S3Endpoint
		}
		if o.S3Region != "" {
			cfg.Region = o.S3Region
		}
		cfg.RetryFor = o.RetryFor
		r.S3 = &cfg
		return r, nil
	}
	p, err := LocalPath(raw)
	if err != nil {
		return r, err
	}
	r.Path = p
	return r, nil
}

// LocalPath resolves file:///path or a plain path to the path.
func LocalPath(raw string) (string, error) {
	if !strings.Contains(raw, "://") {
		return raw, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("%q: %w", raw, err)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return "", fmt.Errorf("%q: file URLs name a local path (file:///path)", raw)
		}
		if u.Path == "" {
			return "", fmt.Errorf("%q: empty path", raw)
		}
		return u.Path, nil
	default:
		return "", fmt.Errorf("%q: scheme %q is not supported (use a path, file:///path or s3://bucket/prefix)", raw, u.Scheme)
	}
}

// OpenStore opens the root for writer, a run id unique to the run: the
// one place where a URL becomes a store.Store.
func OpenStore(ctx context.Context, r Root, writer string) (store.Store, error) {
	if r.S3 != nil {
		return s3.Open(ctx, *r.S3, writer)
	}
	return local.Open(r.Path, writer)
}

// OpenReader opens the root for reading its committed data. A root that
// does not exist is an error (a typo must not read as no data).
func OpenReader(ctx context.Context, r Root, name string) (store.Reader, error) {
	if r.S3 != nil {
		return s3.OpenReader(ctx, *r.S3, name)
	}
	return local.OpenReader(r.Path)
}

// DeadLetterFile returns a dead-letter file at path for a writer of the
// local root r: manifest entries name it by its path under the root when
// it lies there (the writer's next run cuts what they did not make
// durable), else by its absolute path.
func DeadLetterFile(r Root, path string) *local.DeadLetterFile {
	name := path
	if abs, err := filepath.Abs(path); err == nil {
		name = abs
		if root, err := filepath.Abs(r.Path); err == nil && r.Path != "" {
			if rel, err := filepath.Rel(root, abs); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
				name = filepath.ToSlash(rel)
			}
		}
	}
	return local.NewDeadLetterFile(path, name)
}
