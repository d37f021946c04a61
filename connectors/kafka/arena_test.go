package kafka

import "testing"

// TestArenaHeadroom: the headroom grows to the next power of two of a
// value read whole, never shrinks, stops at maxHeadroom; an arena too
// small for the headroom asked now is not handed out again.
func TestArenaHeadroom(t *testing.T) {
	var a arenaPool
	a.free = make(chan []byte, 4)
	first := a.get()
	if cap(first) != ChunkBytes+minHeadroom {
		t.Fatalf("first arena of %d bytes, want %d", cap(first), ChunkBytes+minHeadroom)
	}
	for _, c := range []struct{ fit, headroom int }{
		{100 << 10, minHeadroom}, // within the minimum: unchanged
		{2 << 20, 2 << 20},
		{2<<20 + 1, 4 << 20},
		{3 << 20, 4 << 20}, // never shrinks
		{100 << 20, maxHeadroom},
	} {
		a.fit(c.fit)
		if got := a.size() - ChunkBytes; got != c.headroom {
			t.Errorf("after a value of %d bytes: headroom %d, want %d", c.fit, got, c.headroom)
		}
	}
	a.put(first[:10])
	if b := a.get(); cap(b) != ChunkBytes+maxHeadroom || len(b) != 0 {
		t.Errorf("arena of %d bytes (length %d) after the headroom grew, want %d, empty", cap(b), len(b), ChunkBytes+maxHeadroom)
	}
	big := a.get()
	a.put(big[:5])
	if b := a.get(); &b[:1][0] != &big[:1][0] || len(b) != 0 {
		t.Error("an arena put back was not handed out again, empty")
	}
}
