package schemas

import "sort"

// Ranges is a set of source positions (lines of a file, offsets of a
// partition) as sorted, disjoint, non-adjacent closed intervals [lo, hi].
// The manifest records, per stream, the positions whose fate a commit
// settled (written, dead-lettered or dropped), so that a restart skips
// exactly those.
type Ranges [][2]int64

// Contains reports whether x is in the set.
func (r Ranges) Contains(x int64) bool {
	i := sort.Search(len(r), func(i int) bool { return r[i][1] >= x })
	return i < len(r) && r[i][0] <= x
}

// Add inserts [lo, hi], merging overlapping and adjacent intervals.
func (r *Ranges) Add(lo, hi int64) {
	s := *r
	// First interval that ends at or after lo-1 (could merge).
	i := sort.Search(len(s), func(i int) bool { return s[i][1] >= lo-1 })
	j := i
	for j < len(s) && s[j][0] <= hi+1 {
		lo = min(lo, s[j][0])
		hi = max(hi, s[j][1])
		j++
	}
	if i == j {
		s = append(s, [2]int64{})
		copy(s[i+1:], s[i:])
		s[i] = [2]int64{lo, hi}
	} else {
		s[i] = [2]int64{lo, hi}
		s = append(s[:i+1], s[j:]...)
	}
	*r = s
}

// Union adds every interval of o: one merge of the two sorted lists, so
// that adding a commit's settled positions to a store's, both fragmented
// (small records of many groups interleaved), costs their lengths, not
// their product. An o that is not sorted and disjoint (read from a file
// written by hand) is added interval by interval.
func (r *Ranges) Union(o Ranges) {
	if len(o) <= 2 || len(*r) == 0 || !o.normal() {
		for _, iv := range o {
			r.Add(iv[0], iv[1])
		}
		return
	}
	s := *r
	out := make(Ranges, 0, len(s)+len(o))
	push := func(iv [2]int64) {
		if n := len(out); n > 0 && iv[0] <= out[n-1][1]+1 {
			out[n-1][1] = max(out[n-1][1], iv[1])
			return
		}
		out = append(out, iv)
	}
	i, j := 0, 0
	for i < len(s) || j < len(o) {
		if j == len(o) || (i < len(s) && s[i][0] <= o[j][0]) {
			push(s[i])
			i++
		} else {
			push(o[j])
			j++
		}
	}
	*r = out
}

// normal reports whether r keeps the invariant: sorted, disjoint,
// non-adjacent intervals with lo <= hi.
func (r Ranges) normal() bool {
	for i, iv := range r {
		if iv[0] > iv[1] || (i > 0 && iv[0] <= r[i-1][1]+1) {
			return false
		}
	}
	return true
}

// Len is the number of positions in the set.
func (r Ranges) Len() int64 {
	var n int64
	for _, iv := range r {
		n += iv[1] - iv[0] + 1
	}
	return n
}

// Settled maps a stream (see Source.Stream) to its settled positions.
type Settled map[string]Ranges

// Add records position pos of stream; an empty stream is not tracked.
func (s Settled) Add(stream string, pos int64) {
	if stream == "" {
		return
	}
	r := s[stream]
	r.Add(pos, pos)
	s[stream] = r
}

// Union adds every position of o.
func (s Settled) Union(o Settled) {
	for k, v := range o {
		r := s[k]
		r.Union(v)
		s[k] = r
	}
}

// Contains reports whether src's position is settled.
func (s Settled) Contains(src Source) bool {
	if src.Stream == "" {
		return false
	}
	return s[src.Stream].Contains(src.Position())
}
