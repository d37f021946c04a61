package live

import (
	"net/http/httptest"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/schemas/bearer/bearertest"
)

// TestAuthorised: the token as a bearer header or a basic-auth password
// (browsers), nothing else: not a prefix of it, not a longer string.
func TestAuthorised(t *testing.T) {
	s := New(nil, Options{Token: "s3cret-token"})
	for _, tc := range []struct {
		name string
		set  func(h map[string]string)
		want bool
	}{
		{"bearer", func(h map[string]string) { h["Authorization"] = "Bearer s3cret-token" }, true},
		{"basic", func(h map[string]string) { h["basic"] = "s3cret-token" }, true},
		{"none", func(map[string]string) {}, false},
		{"wrong", func(h map[string]string) { h["Authorization"] = "Bearer s3cret-tokeN" }, false},
		{"prefix", func(h map[string]string) { h["Authorization"] = "Bearer s3cret" }, false},
		{"longer", func(h map[string]string) { h["Authorization"] = "Bearer s3cret-token-and-more" }, false},
		{"no scheme", func(h map[string]string) { h["Authorization"] = "s3cret-token" }, false},
		{"scheme in any case", func(h map[string]string) { h["Authorization"] = "bEARER s3cret-token" }, true},
		{"empty bearer", func(h map[string]string) { h["Authorization"] = "Bearer " }, false},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		h := map[string]string{}
		tc.set(h)
		for k, v := range h {
			if k == "basic" {
				r.SetBasicAuth("any", v)
			} else {
				r.Header.Set(k, v)
			}
		}
		if got := s.authorised(r); got != tc.want {
			t.Errorf("%s: authorised = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestAuthorisedSuite: the bearer header rule every server shares.
func TestAuthorisedSuite(t *testing.T) {
	s := New(nil, Options{Token: bearertest.Token})
	bearertest.Run(t, func(t *testing.T, header string) bool {
		r := httptest.NewRequest("GET", "/", nil)
		if header != "" {
			r.Header.Set("Authorization", header)
		}
		return s.authorised(r)
	})
}
