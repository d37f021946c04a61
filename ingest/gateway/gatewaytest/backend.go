// Package gatewaytest is a stub inference backend for the capture gateway's
// tests: an http.Handler that replays the vLLM- and SGLang-shaped response
// fixtures of ingest/gateway/testdata (non-streaming bodies and SSE
// transcripts), counts calls, keeps the request bodies it received, and can
// delay, fail with a status, cut a stream or hold its last event.
//
// It imports nothing of the gateway: the same fixtures drive the Python stub.
package gatewaytest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Fixture is one recorded upstream call (testdata/README.md).
type Fixture struct {
	Name        string          `json:"name"`
	Engine      string          `json:"engine"`
	Description string          `json:"description"`
	Path        string          `json:"path"`
	Request     json.RawMessage `json:"request"`
	Response    json.RawMessage `json:"response,omitempty"`
	SSEData     []string        `json:"sse_data,omitempty"`
	Expect      Expect          `json:"expect"`
}

// Streaming reports whether the fixture is an SSE transcript.
func (f *Fixture) Streaming() bool { return len(f.SSEData) > 0 }

// Expect is what the gateway must capture from a fixture.
type Expect struct {
	PromptIDs            []int64         `json:"prompt_ids"`
	ResponseIDs          []int64         `json:"response_ids"`
	ResponseLogprobs     []float64       `json:"response_logprobs"`
	FinishReason         string          `json:"finish_reason"`
	ResponseMessage      json.RawMessage `json:"response_message"`
	DeadLetter           string          `json:"dead_letter"`
	NullLogprobPositions []int           `json:"null_logprob_positions"`
	Choices              int             `json:"choices"`
}

// Load reads every *.json fixture of dir, keyed by name.
func Load(dir string) (map[string]*Fixture, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, fmt.Errorf("list fixtures: %w", err)
	}
	out := make(map[string]*Fixture, len(paths))
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("read fixture: %w", err)
		}
		var f Fixture
		if err := json.Unmarshal(b, &f); err != nil {
			return nil, fmt.Errorf("fixture %s: %w", filepath.Base(p), err)
		}
		if f.Name == "" || (len(f.Response) == 0) == (len(f.SSEData) == 0) {
			return nil, fmt.Errorf("fixture %s: needs a name and exactly one of response, sse_data", filepath.Base(p))
		}
		out[f.Name] = &f
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no fixtures in %s", dir)
	}
	return out, nil
}

// Names returns the fixture names, sorted.
func Names(fx map[string]*Fixture) []string {
	names := make([]string, 0, len(fx))
	for n := range fx {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Request is one call the backend received.
type Request struct {
	Method, Path string
	Header       http.Header
	Body         []byte
	Fixture      string // the fixture it was answered with ("" for other routes)
}

// Backend replays fixtures. The zero value is not usable: call NewBackend.
// Per-request controls ride on headers (the gateway forwards them):
// X-Fixture (pick a fixture), X-Stub-Delay-Ms (delay before answering),
// X-Stub-Fail (answer with this status), X-Stub-Cut (cut a stream after
// this many events).
type Backend struct {
	fixtures map[string]*Fixture
	defaults map[string]string // path or path+" stream" → fixture name

	calls     atomic.Int64
	unhealthy atomic.Bool
	forget    atomic.Bool // do not keep request bodies (benchmarks)

	mu         sync.Mutex
	requests   []Request
	delay      time.Duration
	chunkDelay time.Duration
	failNext   int
	failStatus int
	cutAfter   int // next stream: cut after this many events (0: off)
	errAfter   int // next stream: an error event after this many events, then [DONE] (0: off)
	holdLast   chan struct{}
	sentFirst  chan struct{}
}

// NewBackend returns a backend over fixtures. Defaults per route: vllm_chat
// and vllm_chat_stream for chat, vllm_completions(_stream), sglang_generate(_stream).
func NewBackend(fixtures map[string]*Fixture) *Backend {
	return &Backend{fixtures: fixtures, defaults: map[string]string{
		"/v1/chat/completions":        "vllm_chat",
		"/v1/chat/completions stream": "vllm_chat_stream",
		"/v1/completions":             "vllm_completions",
		"/v1/completions stream":      "vllm_completions_stream",
		"/generate":                   "sglang_generate",
		"/generate stream":            "sglang_generate_stream",
	}}
}

// Calls is the number of requests served (every route but /health).
func (b *Backend) Calls() int64 { return b.calls.Load() }

// Requests returns a copy of the requests received so far.
func (b *Backend) Requests() []Request {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]Request(nil), b.requests...)
}

// SetDelay delays every answer by d (before the first byte).
func (b *Backend) SetDelay(d time.Duration) { b.mu.Lock(); b.delay = d; b.mu.Unlock() }

// SetChunkDelay sleeps d between SSE events.
func (b *Backend) SetChunkDelay(d time.Duration) { b.mu.Lock(); b.chunkDelay = d; b.mu.Unlock() }

// FailNext answers the next n completion calls with status and an OpenAI-style error body.
func (b *Backend) FailNext(n, status int) {
	b.mu.Lock()
	b.failNext, b.failStatus = n, status
	b.mu.Unlock()
}

// CutNextStream makes the next stream stop after events events: the
// connection is aborted without the terminating chunk.
func (b *Backend) CutNextStream(events int) { b.mu.Lock(); b.cutAfter = events; b.mu.Unlock() }

// ErrorNextStream makes the next stream send, after events events, an
// error event and then [DONE], as vLLM ends a stream whose generation
// failed: data: {"error": {...}}.
func (b *Backend) ErrorNextStream(events int) { b.mu.Lock(); b.errAfter = events; b.mu.Unlock() }

// HoldLast makes the next stream wait, before its last event, until release
// is closed; first is closed once its first event is flushed.
func (b *Backend) HoldLast() (first <-chan struct{}, release chan<- struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.holdLast, b.sentFirst = make(chan struct{}), make(chan struct{})
	return b.sentFirst, b.holdLast
}

// KeepRequests turns the log of request bodies on (the default) or off.
func (b *Backend) KeepRequests(on bool) { b.forget.Store(!on) }

// SetHealthy sets what /health answers (200 or 503).
func (b *Backend) SetHealthy(ok bool) { b.unhealthy.Store(!ok) }

// ServeHTTP implements http.Handler.
func (b *Backend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" {
		if b.unhealthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
		return
	}
	b.calls.Add(1)
	body, _ := io.ReadAll(r.Body)
	req := Request{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body}
	if r.URL.Path == "/v1/models" {
		b.record(req)
		writeJSON(w, http.StatusOK, `{"object":"list","data":[{"id":"Qwen/Qwen2.5-7B-Instruct","object":"model","owned_by":"vllm","max_model_len":32768}]}`)
		return
	}
	f := b.pick(r, body)
	if f == nil {
		b.record(req)
		writeJSON(w, http.StatusNotFound, `{"object":"error","message":"no fixture for this route","type":"NotFoundError","param":null,"code":404}`)
		return
	}
	req.Fixture = f.Name
	b.record(req)

	b.mu.Lock()
	delay, chunkDelay := b.delay, b.chunkDelay
	fail := 0
	if b.failNext > 0 {
		b.failNext--
		fail = b.failStatus
	}
	cut, errAt := 0, 0
	var hold, first chan struct{}
	if f.Streaming() {
		cut, b.cutAfter = b.cutAfter, 0
		errAt, b.errAfter = b.errAfter, 0
		hold, first = b.holdLast, b.sentFirst
		b.holdLast, b.sentFirst = nil, nil
	}
	b.mu.Unlock()
	if v, err := strconv.Atoi(r.Header.Get("X-Stub-Delay-Ms")); err == nil && v > 0 {
		delay = time.Duration(v) * time.Millisecond
	}
	if v, err := strconv.Atoi(r.Header.Get("X-Stub-Fail")); err == nil && v >= 400 {
		fail = v
	}
	if v, err := strconv.Atoi(r.Header.Get("X-Stub-Cut")); err == nil && v > 0 {
		cut = v
	}
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
	}
	if fail != 0 {
		writeJSON(w, fail, fmt.Sprintf(`{"object":"error","message":"stub failure","type":"InternalServerError","param":null,"code":%d}`, fail))
		return
	}
	if !f.Streaming() {
		writeJSON(w, http.StatusOK, string(f.Response))
		return
	}
	b.stream(w, r, f, cut, errAt, chunkDelay, hold, first)
}

func (b *Backend) stream(w http.ResponseWriter, r *http.Request, f *Fixture, cut, errAt int, chunkDelay time.Duration, hold, first chan struct{}) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	for i, data := range f.SSEData {
		if cut > 0 && i == cut {
			panic(http.ErrAbortHandler) // drop the connection mid-stream
		}
		if errAt > 0 && i == errAt {
			_, _ = io.WriteString(w, "data: {\"error\":{\"object\":\"error\",\"message\":\"stub engine failure\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}\n\ndata: [DONE]\n\n")
			_ = rc.Flush()
			return
		}
		if i == len(f.SSEData)-1 && hold != nil {
			select {
			case <-hold:
			case <-r.Context().Done():
				return
			}
		}
		if i > 0 && chunkDelay > 0 {
			select {
			case <-time.After(chunkDelay):
			case <-r.Context().Done():
				return
			}
		}
		if _, err := io.WriteString(w, "data: "+data+"\n\n"); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
		if i == 0 && first != nil {
			close(first)
		}
	}
}

func (b *Backend) pick(r *http.Request, body []byte) *Fixture {
	if name := r.Header.Get("X-Fixture"); name != "" {
		return b.fixtures[name]
	}
	var probe struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	_ = json.Unmarshal(body, &probe)
	if f, ok := b.fixtures[probe.Model]; ok {
		return f
	}
	key := r.URL.Path
	if probe.Stream {
		key += " stream"
	}
	return b.fixtures[b.defaults[key]]
}

func (b *Backend) record(req Request) {
	if b.forget.Load() {
		return
	}
	b.mu.Lock()
	b.requests = append(b.requests, req)
	b.mu.Unlock()
}

func writeJSON(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = io.Copy(w, bytes.NewReader([]byte(body)))
}
