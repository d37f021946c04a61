package schemas

import (
	"testing"
	"time"
)

func TestFinishedAt(t *testing.T) {
	at := time.Date(2026, 12, 7, 12, 0, 0, 123456000, time.UTC)
	for _, c := range []struct {
		meta string
		ok   bool
	}{
		{`{"session_id":"s","finished_at":"2026-12-07T12:00:00.123456Z"}`, true},
		{`{"finished_at":"yesterday"}`, false},
		{`{"finished_at":7}`, false},
		{`{"session_id":"s"}`, false},
		{``, false},
		{`not json "finished_at"`, false},
	} {
		got, ok := FinishedAt([]byte(c.meta))
		if ok != c.ok || (ok && !got.Equal(at)) {
			t.Errorf("%s: %v %v", c.meta, got, ok)
		}
	}
}
