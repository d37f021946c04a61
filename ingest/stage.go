package ingest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime/debug"

	"golang.org/x/sync/errgroup"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Item is one decoded record, or the reason it was rejected.
type Item struct {
	Source schemas.Source
	// Raw is the original record (for a too-large record only its first
	// bytes), or nil when Ref can read it again from the input: a decoded
	// record of a file or of a Kafka topic is kept by reference (its
	// line's offset; its partition and offset), so that the bytes of every
	// record are not copied for the few that end as dead letters.
	Raw []byte
	Ref RawRef
	// Size is the full length of a too_large record.
	Size int64
	Rec  Record
	Err  *schemas.RejectError
}

// Batch is the decoded form of one Chunk, in source order.
type Batch struct {
	Items []Item
	Blank int64
	Lines int64 // see Chunk.Lines; DecodeStage's batches have 0
}

// DecodeStage reads src and decodes its chunks on workers goroutines,
// delivering batches on out in source order. It closes out when src ends
// (returning nil) or when ctx is cancelled (returning ctx's error: the
// caller tells a stop from a failure); on a read error it returns the error
// and leaves out open, so that nothing downstream mistakes the failure for
// the end of the input. At most 2*workers chunks are in flight,
// so a slow consumer of out pauses reading (backpressure).
func DecodeStage(ctx context.Context, src Source, workers int, out chan<- Batch) (err error) {
	parent := ctx
	defer func() {
		if err == nil || parent.Err() != nil {
			close(out)
		}
	}()
	if workers < 1 {
		workers = 1
	}
	type job struct {
		chunk Chunk
		done  chan Batch
	}
	jobs := make(chan job, workers)
	order := make(chan chan Batch, 2*workers)
	g, ctx := errgroup.WithContext(ctx)
	// Reads run on their own goroutine: a read blocked on a quiet pipe
	// must not keep a stop waiting. On cancellation that goroutine is
	// abandoned; it ends with its blocked read.
	type readResult struct {
		c   Chunk
		err error
	}
	reads := make(chan readResult)
	abandon := make(chan struct{})
	defer close(abandon)
	go func() {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		for {
			c, err := readGuarded(ctx, src)
			select {
			case reads <- readResult{c, err}:
			case <-abandon:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	g.Go(func() error {
		defer close(jobs)
		defer close(order)
		for {
			var r readResult
			select {
			case r = <-reads:
			case <-ctx.Done():
				return ctx.Err()
			}
			c, err := r.c, r.err
			if len(c.Records) > 0 || c.Blank > 0 || c.whole != nil {
				j := job{chunk: c, done: make(chan Batch, 1)}
				select {
				case order <- j.done:
				case <-ctx.Done():
					return ctx.Err()
				}
				select {
				case jobs <- j:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("read source: %w", err)
			}
		}
	})
	for range workers {
		g.Go(func() error {
			defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
			var d Decoder
			for j := range jobs {
				b, err := decodeGuarded(&d, j.chunk)
				if err != nil {
					return err
				}
				if j.chunk.Release != nil {
					j.chunk.Release() // decodeChunk copied or referenced what it keeps
				}
				j.done <- b
			}
			return nil
		})
	}
	g.Go(func() error {
		var lines lineNumbering
		for done := range order {
			var b Batch
			select {
			case b = <-done:
			case <-ctx.Done():
				return ctx.Err()
			}
			lines.number(b.Lines, len(b.Items), func(i int) *schemas.Source { return &b.Items[i].Source })
			b.Lines = 0
			select {
			case out <- b:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	return g.Wait()
}

// decodeChunk decodes c's records (splitting its lines first if its
// source left them whole) into a batch numbered as the chunk is.
func decodeChunk(d *Decoder, c Chunk) Batch {
	c.Split()
	b := Batch{Items: make([]Item, len(c.Records)), Blank: c.Blank, Lines: c.Lines}
	for i, r := range c.Records {
		it := &b.Items[i]
		it.Source = r.Source
		if r.Truncated {
			it.Raw = append([]byte(nil), r.Data...)
			it.Size = r.Size
			it.Err = schemas.Rejectf(schemas.ReasonTooLarge, "", "record is %d bytes, over the limit", r.Size)
			continue
		}
		rec, err := d.Decode(r.Data)
		if err != nil {
			var re *schemas.RejectError
			if !errors.As(err, &re) {
				re = &schemas.RejectError{Reason: schemas.ReasonMalformedJSON, Err: err}
			}
			it.Raw = append([]byte(nil), r.Data...)
			it.Err = re
			continue
		}
		it.Rec, it.Ref = rec, r.Ref
		switch {
		case c.Release == nil:
			it.Raw = r.Data // the chunk's memory is not reused
		case r.Ref.Valid():
			// read again if ever needed
		default:
			it.Raw = append([]byte(nil), r.Data...)
		}
	}
	return b
}

// A mapped input file that shrinks under the run faults when its lost
// pages are touched; the goroutines that touch them (reading, decoding)
// turn the fault into this error instead of a crash.
var errInputChanged = errors.New("the input file changed (shrank) while it was read")

// faulted turns a memory fault panic (debug.SetPanicOnFault) into an
// error in *err; any other panic goes on.
func faulted(err *error) {
	if r := recover(); r != nil {
		if _, ok := r.(interface{ Addr() uintptr }); ok {
			*err = fmt.Errorf("%w (%v)", errInputChanged, r)
			return
		}
		panic(r)
	}
}

func readGuarded(ctx context.Context, src Source) (c Chunk, err error) {
	defer faulted(&err)
	return src.Read(ctx)
}

func decodeGuarded(d *Decoder, c Chunk) (b Batch, err error) {
	defer faulted(&err)
	return decodeChunk(d, c), nil
}
