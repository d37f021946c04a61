package kafka

import (
	"math/bits"
	"sync/atomic"
)

// A partition's fetch reads values into an arena (kafka-go's Batch.Read)
// instead of a fresh slice per message (Batch.ReadMessage): the arena
// goes to the decoder with its chunk and comes back once the chunk is
// decoded, so that reading a topic allocates nothing per record. (A
// decoded Kafka record keeps no bytes: whoever needs them later reads
// them again by offset, see partitionRecords.)
//
// Batch.Read cannot tell a value's size before reading it: a value larger
// than the room left in the arena fails the whole fetch
// (io.ErrShortBuffer), whose rest is discarded and fetched again, that
// value read whole. So a chunk is cut before its arena's room falls below
// the headroom, and the headroom grows to fit the largest value read
// whole (to the next power of two, up to maxHeadroom): a topic of large
// values pays a few fetches again at its start, not one per value.
const (
	minHeadroom = 512 << 10
	maxHeadroom = FetchBytes
)

// arenaPool keeps the arenas of a source's partitions. Its zero value
// works (nothing kept, the minimum headroom).
type arenaPool struct {
	free     chan []byte  // idle arenas; more than it holds are left to the GC
	headroom atomic.Int64 // room kept for a value beyond ChunkBytes
}

// size is the capacity of an arena: ChunkBytes, then the headroom.
func (a *arenaPool) size() int {
	return ChunkBytes + max(int(a.headroom.Load()), minHeadroom)
}

// get returns an empty arena of the current size.
func (a *arenaPool) get() []byte {
	want := a.size()
	for {
		select {
		case b := <-a.free:
			if cap(b) >= want {
				return b[:0]
			}
			// smaller than the headroom now asks: dropped
		default:
			return make([]byte, 0, want)
		}
	}
}

// put takes back an arena none of whose bytes are used any more.
func (a *arenaPool) put(b []byte) {
	select {
	case a.free <- b:
	default:
	}
}

// fit raises the headroom to hold a value of n bytes, if it may.
func (a *arenaPool) fit(n int) {
	h := min(1<<bits.Len(uint(max(n-1, 0))), maxHeadroom)
	for {
		cur := a.headroom.Load()
		if int64(h) <= cur || a.headroom.CompareAndSwap(cur, int64(h)) {
			return
		}
	}
}
