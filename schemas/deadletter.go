package schemas

import (
	"encoding/base64"
	"sync"
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

// Ledger is the bookkeeping every dead-letter writer shares: the positions
// of the records it dead-lettered or saw dropped since its last checkpoint
// (what the next manifest entry settles), and counts by reason. Safe for
// concurrent use.
type Ledger struct {
	mu      sync.Mutex
	pending Settled
	counts  map[Reason]int64 // of letters checkpointed
	waiting map[Reason]int64 // of letters since the last checkpoint
}

// Note records letters and dropped records.
func (l *Ledger) Note(letters []DeadLetter, dropped []Source) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pending == nil {
		l.pending = Settled{}
	}
	if l.waiting == nil {
		l.waiting = map[Reason]int64{}
	}
	for _, d := range letters {
		l.waiting[d.Reason]++
		l.pending.Add(d.Source.Stream, d.Source.Position())
	}
	for _, s := range dropped {
		l.pending.Add(s.Stream, s.Position())
	}
}

// Take hands over the pending positions (nil when there are none); the
// letters noted so far count as checkpointed.
func (l *Ledger) Take() Settled {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.counts == nil {
		l.counts = map[Reason]int64{}
	}
	for k, v := range l.waiting {
		l.counts[k] += v
	}
	l.waiting = nil
	if len(l.pending) == 0 {
		return nil
	}
	p := l.pending
	l.pending = Settled{}
	return p
}

// Drop forgets the pending positions and their letters' counts (their
// records go back to the stream's next owner, who dead-letters them
// again).
func (l *Ledger) Drop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending = Settled{}
	l.waiting = nil
}

// TakeCounts is Take that also returns the counts it moved to the
// checkpointed ones (nil when none): a dead-letter output whose
// checkpoint may later be cut (its manifest entry did not land) gives them
// back with Uncount.
func (l *Ledger) TakeCounts() (Settled, map[Reason]int64) {
	l.mu.Lock()
	moved := l.waiting
	l.mu.Unlock()
	return l.Take(), moved
}

// Uncount takes letters counted at a checkpoint back out of the counts
// (their lines were cut).
func (l *Ledger) Uncount(c map[Reason]int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, v := range c {
		if l.counts[k] -= v; l.counts[k] <= 0 {
			delete(l.counts, k)
		}
	}
}

// Counts returns the letters noted and not dropped, by reason.
func (l *Ledger) Counts() map[Reason]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[Reason]int64, len(l.counts)+len(l.waiting))
	for k, v := range l.counts {
		out[k] = v
	}
	for k, v := range l.waiting {
		out[k] += v
	}
	return out
}
