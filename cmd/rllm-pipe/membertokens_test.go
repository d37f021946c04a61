package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMemberTokensFile: the file's lines become consumer names and their
// own tokens; anything ambiguous is refused without showing a token.
func TestMemberTokensFile(t *testing.T) {
	const shared, admin = "shared-token-0123456789", "admin-token-0123456789"
	dir := t.TempDir()
	file := func(body string) string {
		p := filepath.Join(dir, "tokens")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	got, err := memberTokens(file("# trainers\nrank-0 tok-a-0123456789abcdef\n\n  rank-1\ttok-b-0123456789abcdef  \n"), shared, admin)
	if err != nil || len(got) != 2 || got["rank-0"] != "tok-a-0123456789abcdef" || got["rank-1"] != "tok-b-0123456789abcdef" {
		t.Fatalf("memberTokens = %v, %v", got, err)
	}
	if got, err := memberTokens("", shared, admin); got != nil || err != nil {
		t.Errorf("no file: %v, %v", got, err)
	}
	for _, c := range []struct{ body, want string }{
		{"rank-0\n", "want CONSUMER TOKEN"},
		{"rank-0 a-secret-0123456789 extra\n", "want CONSUMER TOKEN"},
		{"../x a-secret-0123456789\n", "consumer"},
		{"rank-0 a-secret-0123456789\nrank-0 b-secret-0123456789\n", "listed twice"},
		{"rank-0 a-secret-0123456789\nrank-1 a-secret-0123456789\n", `also that of "rank-0"`},
		{"rank-0 " + shared + "\n", "shared or admin"},
		{"rank-0 " + admin + "\n", "shared or admin"},
		{"# nobody\n", "names no consumer"},
	} {
		_, err := memberTokens(file(c.body), shared, admin)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error with %q", c.body, err, c.want)
			continue
		}
		if strings.Contains(err.Error(), "secret") || strings.Contains(err.Error(), shared) || strings.Contains(err.Error(), admin) {
			t.Errorf("%q: the error shows a token: %v", c.body, err)
		}
	}
}
