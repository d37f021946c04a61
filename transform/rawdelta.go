package transform

import (
	"bytes"
	"slices"

	"github.com/rllm-pipe/rllm-pipe/ingest"
)

// minRawSaving is the least a held record must repeat of its
// predecessor's for keepRawAsDelta to keep it as pieces.
const minRawSaving = 256

// rawPiece is a stretch of a held record: literal bytes, or (ref) the
// bytes [lo, hi) of its predecessor's record.
type rawPiece struct {
	lit    []byte
	lo, hi int
	ref    bool
}

// keepRawAsDelta keeps st's record as received, which a dead letter would
// need (a record of stdin or of the gateway's log cannot be read again; a
// file's or Kafka's is held by reference instead), as its differences
// from its predecessor's record praw (prev's, whole as received), when
// the predecessor's prompt and response values start st's prompt value
// and its messages value starts st's messages value, byte for byte: the
// stretches that repeat praw become references to it, the rest is copied.
// A multi-turn trajectory waiting for its group then holds each record's
// new bytes, not every turn's whole conversation again. record rebuilds
// the bytes exactly; nothing is kept as pieces unless it saves
// minRawSaving bytes.
func keepRawAsDelta(st, prev *Step, praw []byte) {
	raw := st.Raw
	type ref struct{ at, lo, hi int } // raw[at:at+hi-lo] == praw[lo:hi]
	var refs []ref
	prefixOf := func(at, end int, s ingest.Span) (int, bool) {
		lo, hi, ok := inner(s, len(praw))
		if !ok || hi == lo || !bytes.HasPrefix(raw[at:end], praw[lo:hi]) {
			return at, false
		}
		refs = append(refs, ref{at, lo, hi})
		return at + hi - lo, true
	}
	if lo, hi, ok := inner(st.spans.Prompt, len(raw)); ok {
		// The predecessor's prompt, then its response: "p1,p2" + "," +
		// "r1" (after optional spaces) + ...
		if at, ok := prefixOf(lo, hi, prev.spans.Prompt); ok && at < hi && raw[at] == ',' {
			at++
			for at < hi && raw[at] == ' ' {
				at++
			}
			prefixOf(at, hi, prev.spans.Response)
		}
	}
	if lo, hi, ok := inner(st.spans.Messages, len(raw)); ok {
		prefixOf(lo, hi, prev.spans.Messages)
	}
	saved := 0
	for _, r := range refs {
		saved += r.hi - r.lo
	}
	if saved < minRawSaving {
		return
	}
	slices.SortFunc(refs, func(a, b ref) int { return a.at - b.at })
	lits := make([]byte, 0, len(raw)-saved) // never grown: the pieces alias it
	pieces := make([]rawPiece, 0, 2*len(refs)+1)
	lit := func(b []byte) {
		if len(b) > 0 {
			n := len(lits)
			lits = append(lits, b...)
			pieces = append(pieces, rawPiece{lit: lits[n:len(lits):len(lits)]})
		}
	}
	pos := 0
	for _, r := range refs {
		lit(raw[pos:r.at])
		pieces = append(pieces, rawPiece{lo: r.lo, hi: r.hi, ref: true})
		pos = r.at + r.hi - r.lo
	}
	lit(raw[pos:])
	st.pieces, st.rawFrom, st.rawLen, st.Raw = pieces, prev, len(raw), nil
}

// inner returns the inside of a bracketed value at s in a record of n
// bytes.
func inner(s ingest.Span, n int) (lo, hi int, ok bool) {
	if !s.Valid() || int(s.Hi) > n || s.Hi-s.Lo < 2 {
		return 0, 0, false
	}
	return int(s.Lo) + 1, int(s.Hi) - 1, true
}

// record returns the step's record as received (nil when its input file
// holds it: Ref). A record kept as pieces is rebuilt, once: the bytes are
// kept, since it is asked for when the step is dead-lettered, and the
// steps after it that refer to it are asked for next.
func (s *Step) record() []byte {
	if s.pieces == nil {
		return s.Raw
	}
	prev := s.rawFrom.record()
	out := make([]byte, 0, s.rawLen)
	for _, p := range s.pieces {
		if p.ref {
			out = append(out, prev[p.lo:p.hi]...)
		} else {
			out = append(out, p.lit...)
		}
	}
	s.Raw, s.pieces, s.rawFrom, s.rawLen = out, nil, nil, 0
	return out
}
