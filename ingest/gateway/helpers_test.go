package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/ingest/gateway/gatewaytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// memOutput is an in-memory Output; fail makes Write fail (and keep nothing).
type memOutput struct {
	mu     sync.Mutex
	recs   []Record
	writes int
	fail   bool
	closed bool
	// refuse, when set, makes Write refuse (RefusedError, nothing kept)
	// the first record it returns true for.
	refuse func(Record) bool
}

func (o *memOutput) Write(ctx context.Context, recs []Record) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.fail {
		return errors.New("output down")
	}
	for i, r := range recs {
		if o.refuse != nil && o.refuse(r) {
			return &RefusedError{Index: i, Reason: "too_large", Err: errors.New("refused by the test")}
		}
	}
	for _, r := range recs {
		o.recs = append(o.recs, Record{Key: r.Key, Line: append([]byte(nil), r.Line...)})
	}
	o.writes++
	return nil
}

func (o *memOutput) Close() error { o.mu.Lock(); o.closed = true; o.mu.Unlock(); return nil }

func (o *memOutput) setFail(f bool) { o.mu.Lock(); o.fail = f; o.mu.Unlock() }

func (o *memOutput) records() []Record {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]Record(nil), o.recs...)
}

// decoded is a record as ingest reads it, with its reject reason.
type decoded struct {
	raw    map[string]any
	rec    ingest.Record
	reason string
}

func decodeAll(t *testing.T, recs []Record) []decoded {
	t.Helper()
	var d ingest.Decoder
	out := make([]decoded, 0, len(recs))
	for _, r := range recs {
		var dec decoded
		if err := json.Unmarshal(r.Line, &dec.raw); err != nil {
			t.Fatalf("record is not JSON: %s", r.Line)
		}
		rec, err := d.Decode(r.Line)
		if err != nil {
			var re interface{ Error() string }
			_ = re
			dec.reason = reasonOf(err)
		}
		dec.rec = rec
		out = append(out, dec)
	}
	return out
}

func reasonOf(err error) string {
	s := err.Error()
	if i := strings.IndexByte(s, ':'); i > 0 {
		return s[:i]
	}
	return s
}

// steps returns the step records by trajectory and step_index (writers
// run concurrently: records reach the output in any order).
func steps(ds []decoded) []decoded {
	var out []decoded
	for _, d := range ds {
		if d.raw["type"] == "step" {
			out = append(out, d)
		}
	}
	slices.SortStableFunc(out, func(a, b decoded) int {
		if c := strings.Compare(fmt.Sprint(a.raw["trajectory_id"]), fmt.Sprint(b.raw["trajectory_id"])); c != 0 {
			return c
		}
		return int(a.raw["step_index"].(float64) - b.raw["step_index"].(float64))
	})
	return out
}

// trajectory returns the one trajectory record.
func trajectory(t *testing.T, ds []decoded) decoded {
	t.Helper()
	var out []decoded
	for _, d := range ds {
		if d.raw["type"] == "trajectory" {
			out = append(out, d)
		}
	}
	if len(out) != 1 {
		t.Fatalf("%d trajectory records", len(out))
	}
	return out[0]
}

type env struct {
	t       *testing.T
	fx      map[string]*gatewaytest.Fixture
	backend *gatewaytest.Backend
	up      *httptest.Server
	gw      *Server
	srv     *httptest.Server
	out     *memOutput
}

func fixtures(t testing.TB) map[string]*gatewaytest.Fixture {
	t.Helper()
	fx, err := gatewaytest.Load("testdata")
	if err != nil {
		t.Fatal(err)
	}
	return fx
}

// newEnv starts a stub backend and a gateway in front of it.
func newEnv(t *testing.T, mod func(*Config)) *env {
	t.Helper()
	e := &env{t: t, fx: fixtures(t), out: &memOutput{}}
	e.backend = gatewaytest.NewBackend(e.fx)
	e.up = httptest.NewServer(e.backend)
	cfg := Config{Upstreams: []string{e.up.URL}, HealthInterval: -1, FinishTimeout: 5 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	gw, err := New(cfg, e.out)
	if err != nil {
		t.Fatal(err)
	}
	e.gw = gw
	e.srv = httptest.NewServer(gw.Handler())
	t.Cleanup(func() {
		e.srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = gw.Close(ctx)
		e.up.Close()
	})
	return e
}

// do sends a request to the gateway and returns status and body.
func (e *env) do(method, path, body string, hdr ...string) (int, []byte) {
	e.t.Helper()
	resp := e.req(method, path, body, hdr...)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatalf("%s %s: read: %v", method, path, err)
	}
	return resp.StatusCode, b
}

func (e *env) req(method, path, body string, hdr ...string) *http.Response {
	e.t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp
}

func (e *env) mustJSON(method, path, body string, want int, v any, hdr ...string) {
	e.t.Helper()
	code, b := e.do(method, path, body, hdr...)
	if code != want {
		e.t.Fatalf("%s %s: status %d, want %d: %s", method, path, code, want, b)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			e.t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
}

func (e *env) finish(sid string, reward float64) map[string]any {
	e.t.Helper()
	var out map[string]any
	e.mustJSON("POST", "/sessions/"+sid+"/finish", `{"reward":`+jsonNum(reward)+`,"is_correct":true,"termination_reason":"env_done"}`, 200, &out)
	return out
}

func jsonNum(f float64) string { b, _ := json.Marshal(f); return string(b) }

// sseData reads the data payloads of an SSE body.
func sseData(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

// jsonEqual compares two JSON texts by value.
func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

func lastMessage(t *testing.T, d decoded) []byte {
	t.Helper()
	msgs, _ := d.raw["messages"].([]any)
	if len(msgs) == 0 {
		return nil
	}
	b, _ := json.Marshal(msgs[len(msgs)-1])
	return b
}

func ints(v any) []int64 {
	a, _ := v.([]any)
	if v == nil {
		return nil
	}
	out := make([]int64, len(a))
	for i, x := range a {
		out[i] = int64(x.(float64))
	}
	return out
}

func floats(v any) []float64 {
	a, _ := v.([]any)
	if v == nil {
		return nil
	}
	out := make([]float64, len(a))
	for i, x := range a {
		out[i] = x.(float64)
	}
	return out
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func sortStrings(s []string) { slices.Sort(s) }
