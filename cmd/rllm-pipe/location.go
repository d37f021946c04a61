package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/rllm-pipe/rllm-pipe/connectors"
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

// parseBytes reads sizes such as 256MiB, 64MB, 1GiB or 1048576.
func parseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("size %q: want a positive whole number with an optional unit (KiB, MiB, GiB)", s)
	}
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("size %q: too large", s)
	}
	return n * mult, nil
}
