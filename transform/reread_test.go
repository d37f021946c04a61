package transform

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// memLog is a fake input that records can be read from again, as a Kafka
// partition: its records by offset, and the calls made to it.
type memLog struct {
	recs  map[int64][]byte
	gone  map[int64]bool
	calls [][]int64
}

func (l *memLog) Reread(ctx context.Context, refs []ingest.RawRef) ([][]byte, []error, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	var offs []int64
	recs, errs := make([][]byte, len(refs)), make([]error, len(refs))
	for i, r := range refs {
		offs = append(offs, r.Off)
		if l.gone[r.Off] {
			errs[i] = errors.New("no longer held")
			continue
		}
		recs[i] = l.recs[r.Off]
	}
	l.calls = append(l.calls, offs)
	return recs, errs, nil
}

// TestHeldRecordsReadAgain: a record its input can read again (a Kafka
// record: bytes and a reference) is held by reference while its group is
// open; the dead letters of a group closed incomplete get their records
// from the input, all of one input in one call, and a record the input
// no longer holds leaves its letter saying so. A record rejected on
// arrival is written with the bytes in hand, never read again.
func TestHeldRecordsReadAgain(t *testing.T) {
	in := &memLog{recs: map[int64][]byte{}, gone: map[int64]bool{}}
	a := NewAssembler(Config{GroupSize: 4, MinGroupSize: 2})
	var d ingest.Decoder
	add := func(off int64, line string) {
		t.Helper()
		rec, err := d.Decode([]byte(line))
		if err != nil {
			t.Fatal(err)
		}
		in.recs[off] = []byte(line)
		it := ingest.Item{Source: schemas.Source{Topic: "t", Offset: off}, Raw: []byte(line), Rec: rec,
			Ref: ingest.RawRef{From: in, Off: off, Len: len(line)}}
		a.Add(&it, t0)
	}
	add(0, traj("A", "a1", 1, 2))
	add(1, step("A", "a1", 0))
	add(2, step("A", "a1", 1))
	add(3, step("A", "a2", 0))                // a2 never completes: the group closes with one trajectory
	add(4, step("A", "a1", 0, `"model":"m"`)) // step a1#0 again, different: rejected on arrival
	for _, it := range a.trajs {
		for _, s := range it.Steps {
			if s.Raw != nil {
				t.Fatalf("step %s held its bytes, not its reference", s.StepID)
			}
		}
	}
	in.gone[3] = true
	a.Flush()
	o := a.Take()
	if len(in.calls) != 0 {
		t.Fatalf("the input was read again before ReadRecords: %v", in.calls)
	}
	if err := o.ReadRecords(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(in.calls) != 1 || len(in.calls[0]) != 4 {
		t.Fatalf("read again in %d calls (%v), want the 4 held records in one", len(in.calls), in.calls)
	}
	if len(o.Dead) != 5 {
		t.Fatalf("%d dead letters, want 5", len(o.Dead))
	}
	for _, l := range o.Dead {
		off := l.Source.Offset
		switch {
		case off == 3:
			if l.Record != nil || !strings.Contains(l.Error, "could not be read again: no longer held") {
				t.Errorf("offset 3 (gone): record %q, error %q", l.Record, l.Error)
			}
		case string(l.Record) != string(in.recs[off]):
			t.Errorf("offset %d (%s): record %q, want %q", off, l.Reason, l.Record, in.recs[off])
		}
	}
	if o.Dead[0].Reason != schemas.ReasonDuplicateConflict || o.Dead[0].Source.Offset != 4 {
		t.Errorf("first letter %s at offset %d, want the arrival's duplicate_conflict at 4", o.Dead[0].Reason, o.Dead[0].Source.Offset)
	}

	// An input that cannot be read (the run stopping) fails the call:
	// the letters are not to be written half done.
	add(5, step("B", "b1", 0))
	a.Flush()
	o = a.Take()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := o.ReadRecords(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("ReadRecords with its context ended: %v", err)
	}
}
