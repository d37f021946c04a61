package compare

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// records are the inputs of the JSON benchmarks: 100 groups (about 2,900
// lines), with and without chat messages.
var records = sync.OnceValue(func() map[string][]byte {
	out := map[string][]byte{}
	for name, msgs := range map[string]bool{"messages": true, "nomsg": false} {
		b, err := Records(100, msgs)
		if err != nil {
			panic(err)
		}
		out[name] = b
	}
	return out
})

// normalise makes records comparable across decoders: raw JSON values
// compacted (simdjson-go re-serialises them) and signals in name order
// (sonic decodes them into a map).
func normalise(t *testing.T, r ingest.Record) ingest.Record {
	compact := func(b []byte) []byte {
		if b == nil {
			return nil
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, b); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	if r.Step != nil {
		s := *r.Step
		s.Messages, s.Metadata = compact(s.Messages), compact(s.Metadata)
		r.Step = &s
	}
	if r.Trajectory != nil {
		tr := *r.Trajectory
		tr.Metadata = compact(tr.Metadata)
		tr.Signals = slices.Clone(tr.Signals)
		slices.SortFunc(tr.Signals, func(a, b schemas.Signal) int { return strings.Compare(a.Name, b.Name) })
		r.Trajectory = &tr
	}
	r.Repaired = 0
	return r
}

// TestSameRecords checks that sonic and simdjson-go, as used by the
// benchmarks, fill the very records ingest.Decoder fills, so the
// benchmark compares equal work.
func TestSameRecords(t *testing.T) {
	for name, data := range records() {
		t.Run(name, func(t *testing.T) {
			var want []ingest.Record
			if err := DecodeOurs(data, func(r ingest.Record) { want = append(want, normalise(t, r)) }); err != nil {
				t.Fatal(err)
			}
			if len(want) < 1000 {
				t.Fatalf("only %d records", len(want))
			}
			for lib, decode := range map[string]func([]byte, func(ingest.Record)) error{
				"sonic": DecodeSonic,
				"simdjson": func(b []byte, fn func(ingest.Record)) error {
					var d SimdDecoder
					return d.Decode(b, fn)
				},
			} {
				var got []ingest.Record
				if err := decode(data, func(r ingest.Record) { got = append(got, normalise(t, r)) }); err != nil {
					t.Fatalf("%s: %v", lib, err)
				}
				if len(got) != len(want) {
					t.Fatalf("%s: %d records, want %d", lib, len(got), len(want))
				}
				for i := range want {
					if !reflect.DeepEqual(got[i], want[i]) {
						t.Fatalf("%s: record %d differs:\n got %+v\nwant %+v", lib, i, deref(got[i]), deref(want[i]))
					}
				}
			}
		})
	}
}

func deref(r ingest.Record) any {
	if r.Step != nil {
		s := *r.Step
		s.PromptIDs, s.Messages = s.PromptIDs[:min(4, len(s.PromptIDs))], nil
		return s
	}
	return *r.Trajectory
}

// BenchmarkJSON decodes the same lines into the same records with each
// decoder on one goroutine, side by side: MB/s of input and records/s.
// simdjson-go parses 1 MiB chunks of lines at once (ParseND), as the line
// source hands them out; the others decode line by line.
func BenchmarkJSON(b *testing.B) {
	for _, name := range []string{"messages", "nomsg"} {
		data := records()[name]
		chunks := chunked(data, 1<<20)
		b.Run(name, func(b *testing.B) {
			forRounds(b, []string{"ours", "sonic", "simdjson"}, func(b *testing.B, c string) {
				var n int
				count := func(ingest.Record) { n++ }
				var ours ingest.Decoder
				var simd SimdDecoder
				decode := map[string]func() error{
					"ours": func() error {
						return lines(data, func(l []byte) error {
							r, err := ours.Decode(l)
							count(r)
							return err
						})
					},
					"sonic": func() error { return DecodeSonic(data, count) },
					"simdjson": func() error {
						for _, c := range chunks {
							if err := simd.Decode(c, count); err != nil {
								return err
							}
						}
						return nil
					},
				}[c]
				b.SetBytes(int64(len(data)))
				b.ReportAllocs()
				for b.Loop() {
					if err := decode(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "records/s")
			})
		})
	}
}

// chunked cuts data into runs of whole lines of about size bytes.
func chunked(data []byte, size int) [][]byte {
	var out [][]byte
	for len(data) > 0 {
		end := len(data)
		if size < end {
			end = size + bytes.IndexByte(data[size:], '\n') + 1
		}
		out = append(out, data[:end])
		data = data[end:]
	}
	return out
}
