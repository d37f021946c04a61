package ingest

import (
	"fmt"
	"strings"
	"testing"
	"unsafe"
)

func TestReadAheadRange(t *testing.T) {
	const mb = 1 << 20
	p := pageSize
	tests := []struct {
		name             string
		ahead, end, size int
		wantLo, wantHi   int
		wantOK           bool
	}{
		{"first chunk", 0, mb, 100 * mb, mb, mb + readAheadBytes, true},
		{"less than a step used", mb + readAheadBytes, 2 * mb, 100 * mb, 0, 0, false},
		{"a step used", mb + readAheadBytes, mb + readAheadStep, 100 * mb, mb + readAheadBytes, mb + readAheadStep + readAheadBytes, true},
		{"chunk end inside a page", 0, mb + 100, 100 * mb, mb, mb + 100 + readAheadBytes, true},
		{"the last bit, under a step", 98 * mb, 97 * mb, 100 * mb, 98 * mb, 100 * mb, true},
		{"all asked for", 100 * mb, 99 * mb, 100 * mb, 0, 0, false},
		{"chunk at the end", 0, 5*p + 7, 5*p + 7, 0, 0, false},
		{"small file", 0, 3*p + 5, 10*p + 7, 3 * p, 10*p + 7, true},
		{"chunk past what was asked for", 2 * mb, 40 * mb, 100 * mb, 40 * mb, 40*mb + readAheadBytes, true},
	}
	for _, tt := range tests {
		lo, hi, ok := readAheadRange(tt.ahead, tt.end, tt.size)
		if lo != tt.wantLo || hi != tt.wantHi || ok != tt.wantOK {
			t.Errorf("%s: readAheadRange(%d, %d, %d) = %d, %d, %v; want %d, %d, %v",
				tt.name, tt.ahead, tt.end, tt.size, lo, hi, ok, tt.wantLo, tt.wantHi, tt.wantOK)
		}
	}
}

// Reading a mapped file asks the kernel for the file ahead of the chunks:
// the hints are page aligned, inside the mapping, in order, one per step
// of use rather than one per chunk, always reaching well past the chunk
// just handed out, and they end at the end of the mapping.
func TestMappedReadAhead(t *testing.T) {
	var in strings.Builder
	for i := 0; in.Len() < readAheadBytes+6*readAheadStep+12345; i++ {
		fmt.Fprintf(&in, "%d:%s\n", i, strings.Repeat("r", 500+i%1500))
	}
	src, _ := openMapped(t, in.String(), 0)
	if populate(src.m.data[:pageSize]) != nil {
		t.Skip("the kernel cannot populate a mapping: chunks are copied, without hints")
	}
	type hint struct{ lo, hi int }
	var hints []hint
	base := uintptr(unsafe.Pointer(unsafe.SliceData(src.m.data)))
	defer func(f func([]byte)) { adviseWillNeed = f }(adviseWillNeed)
	adviseWillNeed = func(b []byte) {
		lo := int(uintptr(unsafe.Pointer(unsafe.SliceData(b))) - base)
		hints = append(hints, hint{lo, lo + len(b)})
	}
	size := len(src.m.data)
	chunks := 0
	eachChunk(t, src, func(c Chunk) {
		chunks++
		end := int(c.whole.off) + len(c.whole.data)
		if len(hints) == 0 {
			t.Fatalf("chunk %d (to byte %d) handed out with no read-ahead asked for", chunks, end)
		}
		if reach, want := hints[len(hints)-1].hi, min(end+readAheadBytes-readAheadStep, size); reach < want {
			t.Fatalf("chunk %d ends at byte %d; read ahead to %d, want at least %d", chunks, end, reach, want)
		}
		c.Release()
	})
	for i, h := range hints {
		if h.lo%pageSize != 0 || h.lo < 0 || h.hi > size || h.hi <= h.lo {
			t.Fatalf("hint %d: [%d, %d) of a mapping of %d bytes: not page aligned or outside it", i, h.lo, h.hi, size)
		}
		if i > 0 && (h.lo < hints[i-1].hi-pageSize || h.hi <= hints[i-1].hi) {
			t.Fatalf("hint %d [%d, %d) after [%d, %d): out of order or asked again", i, h.lo, h.hi, hints[i-1].lo, hints[i-1].hi)
		}
	}
	if last := hints[len(hints)-1].hi; last != size {
		t.Fatalf("read ahead to byte %d of %d", last, size)
	}
	if most := size/readAheadStep + 2; len(hints) > most || chunks < 2*len(hints) {
		t.Fatalf("%d hints for %d chunks of %d bytes: want at most %d, fewer than one per chunk", len(hints), chunks, size, most)
	}
}
