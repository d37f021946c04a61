package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"testing"
)

// TestPublishVersion: the highest version published is served; a lower
// one changes nothing; bad values are usage errors.
func TestPublishVersion(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	ctx := context.Background()
	served := func() int64 {
		t.Helper()
		var out bytes.Buffer
		if code := run(ctx, []string{"publish-version", "--from", root, "--show"}, &out, io.Discard); code != 0 {
			t.Fatalf("--show: exit %d", code)
		}
		var p struct {
			PolicyVersion int64 `json:"policy_version"`
		}
		if err := json.Unmarshal(out.Bytes(), &p); err != nil {
			t.Fatalf("%v: %s", err, out.String())
		}
		return p.PolicyVersion
	}
	if v := served(); v != -1 {
		t.Fatalf("nothing published: %d", v)
	}
	for _, v := range []string{"7", "3"} {
		if code := run(ctx, []string{"publish-version", "--from", root, "--policy-version", v}, io.Discard, io.Discard); code != 0 {
			t.Fatalf("publish %s: exit %d", v, code)
		}
	}
	if v := served(); v != 7 {
		t.Fatalf("served %d, want 7 (3 came after, lower)", v)
	}
	for _, args := range [][]string{
		{"publish-version", "--from", root},
		{"publish-version", "--from", root, "--policy-version", "-2"},
		{"publish-version", "--from", root, "--policy-version", "1", "--consumer-group", "../x"},
		{"publish-version", "--policy-version", "1"},
	} {
		if code := run(ctx, args, io.Discard, io.Discard); code != exitUsage {
			t.Errorf("%q: exit %d, want %d", args, code, exitUsage)
		}
	}
}
