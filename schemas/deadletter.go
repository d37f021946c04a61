package schemas

import (
	"encoding/base64"
	"unicode/utf8"
)

// DeadLetter is a record that will not be written, with why. Record holds
// the original bytes (for a too_large record only its first bytes; then
// Truncated is set and Size is the full length).
type DeadLetter struct {
	Reason    Reason
	Error     string
	Source    Source
	Record    []byte
	Truncated bool
	Size      int64
}

// DeadLetterLine is the JSON form of one dead letter.
type DeadLetterLine struct {
	Reason Reason `json:"reason"`
	Error  string `json:"error"`
	Source Source `json:"source"`
	// Record is the original bytes: as text when they are valid UTF-8,
	// else base64 (std encoding) with RecordEncoding "base64".
	Record         string `json:"record"`
	RecordEncoding string `json:"record_encoding,omitempty"`
	// Truncated marks a too_large record of which only the first bytes are
	// kept; Size is its full length.
	Truncated bool  `json:"truncated,omitempty"`
	Size      int64 `json:"size,omitempty"`
}

// Line returns the JSON line form of d.
func (d DeadLetter) Line() DeadLetterLine {
	l := DeadLetterLine{Reason: d.Reason, Error: d.Error, Source: d.Source, Truncated: d.Truncated}
	if d.Truncated {
		l.Size = d.Size
	}
	if utf8.Valid(d.Record) {
		l.Record = string(d.Record)
	} else {
		l.Record = base64.StdEncoding.EncodeToString(d.Record)
		l.RecordEncoding = "base64"
	}
	return l
}
