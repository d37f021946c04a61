package schemas_test

import (
	"os"
	"strings"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/ingest"
)

// TestREADMEExamples keeps the documented examples valid.
func TestREADMEExamples(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(string(b), "```json\n")
	if len(parts) != 4 {
		t.Fatalf("want 3 examples (step, step with a prompt delta, trajectory), found %d", len(parts)-1)
	}
	var d ingest.Decoder
	for _, p := range parts[1:] {
		line := strings.TrimSpace(p[:strings.Index(p, "```")])
		if _, err := d.Decode([]byte(line)); err != nil {
			t.Errorf("example does not decode: %v\n%s", err, line)
		}
	}
}
