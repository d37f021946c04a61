// Package bearertest is the suite every server that checks bearer tokens
// (package bearer) runs against its own front door, so that they all
// accept and refuse the same Authorization headers.
package bearertest

import "testing"

// Token is the token a server under test must be configured with
// (written as a token file would hold it, final newline included).
const Token = "s3cret-Token.42\n"

// Case is one Authorization header value and whether it must be accepted.
type Case struct {
	Name   string
	Header string // "" sends no Authorization header
	OK     bool
}

// Cases are the headers every server is checked with.
var Cases = []Case{
	{"bearer", "Bearer s3cret-Token.42", true},
	{"scheme in lower case", "bearer s3cret-Token.42", true},
	{"scheme in upper case", "BEARER s3cret-Token.42", true},
	{"token with surrounding space", "Bearer   s3cret-Token.42  ", true},
	{"no header", "", false},
	{"wrong token", "Bearer s3cret-Token.43", false},
	{"prefix of the token", "Bearer s3cret-Token.4", false},
	{"token and more", "Bearer s3cret-Token.42x", false},
	{"token in another case", "Bearer S3CRET-TOKEN.42", false},
	{"empty token", "Bearer ", false},
	{"token without scheme", "s3cret-Token.42", false},
	{"another scheme", "Token s3cret-Token.42", false},
}

// Run checks every Case against accepts, which sends one request to the
// server configured with Token, carrying header as its Authorization
// (none when empty), and reports whether it was let through.
func Run(t *testing.T, accepts func(t *testing.T, header string) bool) {
	t.Helper()
	for _, c := range Cases {
		t.Run(c.Name, func(t *testing.T) {
			if got := accepts(t, c.Header); got != c.OK {
				t.Errorf("Authorization %q: accepted %v, want %v", c.Header, got, c.OK)
			}
		})
	}
}
