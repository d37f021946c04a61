package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// bodies bounds the request bodies the server holds at once
// (Config.MaxRequestBodiesBytes): the per-request bound
// (Config.MaxRequestBytes) alone lets N concurrent requests hold N times
// it. A body's bytes are reserved as they are read and released when its
// handler returns (the request's context ends); a read that would pass
// the budget fails with errBodiesFull at once, so that a client cannot
// make the gateway wait holding what it sent.
type bodies struct {
	mu    sync.Mutex
	limit int64
	held  int64
}

// errBodiesFull is a body that does not fit in what the other requests'
// bodies leave of the budget.
var errBodiesFull = errors.New("the gateway holds as many request bytes as it may (MaxRequestBodiesBytes)")

// reserve takes n bytes of the budget; false if they do not fit.
func (b *bodies) reserve(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held+n > b.limit {
		return false
	}
	b.held += n
	return true
}

func (b *bodies) release(n int64) {
	b.mu.Lock()
	b.held -= n
	b.mu.Unlock()
}

// inUse is how many bytes of bodies are held.
func (b *bodies) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held
}

// read reads r's body, at most limit bytes (more: an *http.MaxBytesError,
// as http.MaxBytesReader gives; a Content-Length over limit fails before
// a byte is read), into a buffer sized from Content-Length where given,
// reserving its bytes from b as the buffer grows; they are released when
// r's context ends.
func (b *bodies) read(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	var reserved int64
	release := func() {
		if reserved > 0 {
			b.release(reserved)
		}
	}
	grow := func(n int64) error {
		if !b.reserve(n) {
			return errBodiesFull
		}
		reserved += n
		return nil
	}
	src := http.MaxBytesReader(w, r.Body, limit)
	size := int64(32 << 10)
	if r.ContentLength >= 0 {
		size = r.ContentLength + 1 // +1: the read that sees the end
	}
	if err := grow(size); err != nil {
		return nil, err
	}
	buf := make([]byte, 0, size)
	for {
		if len(buf) == cap(buf) {
			// Double, up to limit+1 bytes: MaxBytesReader fails the read
			// past limit before the buffer is full again.
			more := max(1, min(int64(cap(buf)), limit+1-int64(cap(buf))))
			if err := grow(more); err != nil {
				release()
				return nil, err
			}
			next := make([]byte, len(buf), int64(cap(buf))+more)
			copy(next, buf)
			buf = next
		}
		n, err := src.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			release()
			return nil, err
		}
	}
	context.AfterFunc(r.Context(), release)
	return buf, nil
}

// bodiesFull answers a request whose body did not fit in the budget.
func (s *Server) bodiesFull(w http.ResponseWriter, openai bool) {
	s.metrics.errors.inc("bodies_full")
	w.Header().Set("Retry-After", "1")
	msg := fmt.Sprintf("%v: retry later", errBodiesFull)
	if openai {
		writeOpenAIError(w, http.StatusServiceUnavailable, "server_busy", msg)
	} else {
		writeError(w, http.StatusServiceUnavailable, msg)
	}
}
