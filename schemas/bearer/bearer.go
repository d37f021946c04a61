// Package bearer is the one rule by which every rllm-pipe server reads and
// checks a token: the capture gateway, the Flight endpoint of serve, the
// live view of ui and the metrics endpoint of ingest.
//
//   - A token travels as "Authorization: Bearer TOKEN" (Parse): the
//     scheme in any case (RFC 9110), the token trimmed of surrounding
//     white space. Servers that also take a token elsewhere (x-api-key,
//     a browser's basic-auth password) hand that string to Key.Matches
//     the same way.
//   - Tokens are compared as SHA-256 digests in constant time
//     (Key.Matches), so neither a token's bytes nor its length show in
//     the time a refusal takes; a Key holds the digest only.
//   - Configured and presented tokens are both trimmed: a token file's
//     final newline is not part of the token.
//
// It does no I/O and keeps no state but the digest.
package bearer

import (
	"crypto/sha256"
	"crypto/subtle"
	"strings"
)

// Parse returns the token of an Authorization header value of the bearer
// scheme ("Bearer TOKEN", the scheme in any case), trimmed. ok is false
// for another scheme or an empty token.
func Parse(authorization string) (token string, ok bool) {
	scheme, rest, found := strings.Cut(strings.TrimSpace(authorization), " ")
	if !found || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(rest)
	return token, token != ""
}

// Key is an accepted token, held as its digest. The zero Key matches
// nothing.
type Key struct {
	digest [sha256.Size]byte
	set    bool
}

// NewKey is the Key of token, trimmed; an empty token gives the zero Key.
func NewKey(token string) Key {
	token = strings.TrimSpace(token)
	if token == "" {
		return Key{}
	}
	return Key{digest: sha256.Sum256([]byte(token)), set: true}
}

// IsSet reports whether k holds a token.
func (k Key) IsSet() bool { return k.set }

// Matches reports whether the presented token, trimmed, is k's, comparing
// digests in constant time. An empty presented token never matches.
func (k Key) Matches(presented string) bool {
	presented = strings.TrimSpace(presented)
	got := sha256.Sum256([]byte(presented))
	eq := subtle.ConstantTimeCompare(got[:], k.digest[:])
	return k.set && presented != "" && eq == 1
}
