package bearer

import "testing"

func TestParse(t *testing.T) {
	for _, c := range []struct {
		name, header, want string
		ok                 bool
	}{
		{"plain", "Bearer s3cret", "s3cret", true},
		{"scheme in any case", "bEaReR s3cret", "s3cret", true},
		{"token trimmed", "Bearer   s3cret \t", "s3cret", true},
		{"header trimmed", "  Bearer s3cret", "s3cret", true},
		{"token keeps inner space", "Bearer a b", "a b", true},
		{"empty token", "Bearer ", "", false},
		{"blank token", "Bearer    ", "", false},
		{"no token", "Bearer", "", false},
		{"basic scheme", "Basic dXNlcjpwYXNz", "", false},
		{"scheme prefix only", "Bearers s3cret", "", false},
		{"empty", "", "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := Parse(c.header)
			if got != c.want || ok != c.ok {
				t.Errorf("Parse(%q) = %q, %v; want %q, %v", c.header, got, ok, c.want, c.ok)
			}
		})
	}
}

func TestKey(t *testing.T) {
	k := NewKey("s3cret\n") // as read from a token file
	if !k.IsSet() {
		t.Fatal("NewKey(s3cret) is not set")
	}
	for _, c := range []struct {
		presented string
		want      bool
	}{
		{"s3cret", true},
		{" s3cret\t", true},
		{"s3cre", false},
		{"s3cret2", false},
		{"S3CRET", false},
		{"", false},
	} {
		if got := k.Matches(c.presented); got != c.want {
			t.Errorf("Matches(%q) = %v, want %v", c.presented, got, c.want)
		}
	}
	var zero Key
	for _, tok := range []string{"", " ", "\n"} {
		if NewKey(tok).IsSet() {
			t.Errorf("NewKey(%q) is set", tok)
		}
	}
	// The zero Key's digest is all zeros: no presented token may match it,
	// the empty one included.
	for _, p := range []string{"", "x"} {
		if zero.Matches(p) {
			t.Errorf("the zero Key matches %q", p)
		}
	}
}
