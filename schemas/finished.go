package schemas

import (
	"bytes"
	"encoding/json"
	"time"
)

// FinishedAtKey is the trajectory metadata key the capture gateway writes
// with the time a trajectory's finish arrived (RFC 3339, UTC): how fresh a
// group is when a trainer gets it is measured from it.
const FinishedAtKey = "finished_at"

var finishedAtField = []byte(`"` + FinishedAtKey + `"`)

// FinishedAt reads FinishedAtKey from a trajectory's metadata (a JSON
// object); false when it is absent or not a time.
func FinishedAt(metadata []byte) (time.Time, bool) {
	if !bytes.Contains(metadata, finishedAtField) { // most rows: no parse
		return time.Time{}, false
	}
	var m struct {
		At string `json:"finished_at"`
	}
	if json.Unmarshal(metadata, &m) != nil || m.At == "" {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, m.At)
	return t, err == nil
}
