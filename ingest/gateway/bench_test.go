package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/ingest/gateway/gatewaytest"
)

// countOutput acknowledges every write and keeps only a count.
type countOutput struct{ n atomic.Int64 }

func (o *countOutput) Write(_ context.Context, recs []Record) error {
	o.n.Add(int64(len(recs)))
	return nil
}
func (o *countOutput) Close() error { return nil }

// BenchmarkGatewayLatency measures the latency the gateway adds over
// calling the stub backend directly, at 500 concurrent sessions: each
// session alternates a direct call and the same call through the gateway
// (a recorded chat completion, non-streaming; and a streaming one, timed to
// its first event), so both see the same load. A run is 500 sessions × 4
// call pairs of each kind; the benchmark makes 3 runs and reports the
// median of the runs' p50 and p99 differences (gateway minus direct) and
// their spread (max − min over the runs).
//
// upstream=200ms: the stub answers after 200 ms, a short generation, so
// 500 sessions (their starts spread over 200 ms) make ~2,500 calls/s in
// all: the gateway's own cost under realistic concurrency. upstream=0: an instant stub, every session
// calling back to back: the box is CPU-bound (client, gateway and stub
// share its cores, and a call through the gateway costs them two HTTP
// exchanges instead of one), so the difference is mostly queueing.
//
// sessions=1: one session calling back to back, the floor (no queueing).
func BenchmarkGatewayLatency(b *testing.B) {
	for _, c := range []struct {
		sessions int
		delay    time.Duration
	}{{500, 200 * time.Millisecond}, {500, 0}, {1, 0}} {
		b.Run(fmt.Sprintf("sessions=%d/upstream=%v", c.sessions, c.delay), func(b *testing.B) { benchLatency(b, c.sessions, c.delay, false) })
	}
}

// BenchmarkGatewayPaced is BenchmarkGatewayLatency's 500 sessions with
// pacing on (a trainer polled every 10 ms whose budget admits them all:
// what admission costs each call, not waiting), and the calls per second
// through the gateway; pacing=off is the same without, run beside it.
func BenchmarkGatewayPaced(b *testing.B) {
	for _, paced := range []bool{false, true} {
		name := map[bool]string{false: "pacing=off", true: "pacing=on"}[paced]
		b.Run("sessions=500/upstream=200ms/"+name, func(b *testing.B) { benchLatency(b, 500, 200*time.Millisecond, paced) })
	}
}

// roomyTrainer is a trainer whose pipe is always empty.
type roomyTrainer struct{}

func (roomyTrainer) State(context.Context) (TrainerState, error) {
	return TrainerState{Version: -1}, nil
}

func benchLatency(b *testing.B, sessions int, delay time.Duration, paced bool) {
	const runs = 3
	pairs := max(4, 1000/sessions)
	fx := fixtures(b)
	backend := gatewaytest.NewBackend(fx)
	backend.KeepRequests(false)
	backend.SetDelay(delay)
	up := httptest.NewServer(backend)
	defer up.Close()
	out := &countOutput{}
	cfg := Config{Upstreams: []string{up.URL}, HealthInterval: -1}
	if paced {
		cfg.Trainer, cfg.TrainerPoll = roomyTrainer{}, 10*time.Millisecond
		cfg.Pacing = Pacing{MaxOffPolicy: 0, GroupsPerStep: 1 << 20}
	}
	gw, err := New(cfg, out)
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(gw.Handler())
	defer func() {
		srv.Close()
		_ = gw.Close(context.Background())
	}()
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 2048, IdleConnTimeout: time.Minute,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext}}
	defer client.CloseIdleConnections()
	body := string(fx["vllm_chat"].Request)
	streamBody := string(fx["vllm_chat_stream"].Request)

	// call returns the time to the whole body (stream=false) or to the
	// first SSE event (stream=true).
	call := func(url, body string, stream bool) time.Duration {
		t0 := time.Now()
		resp, err := client.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			b.Error(err)
			return 0
		}
		defer resp.Body.Close()
		var d time.Duration
		if stream {
			br := bufio.NewReader(resp.Body)
			if _, err := br.ReadString('\n'); err != nil {
				b.Error(err)
			}
			d = time.Since(t0)
			_, _ = io.Copy(io.Discard, br)
		} else {
			_, _ = io.Copy(io.Discard, resp.Body)
			d = time.Since(t0)
		}
		if resp.StatusCode != 200 {
			b.Errorf("status %d", resp.StatusCode)
		}
		return d
	}
	type result struct{ p50, p99, ttft50, ttft99, callsPerS float64 }
	run := func(r int) result {
		var mu sync.Mutex
		var direct, via, directT, viaT []time.Duration
		var wg sync.WaitGroup
		start := make(chan struct{})
		for s := range sessions {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				// Spread the sessions' starts over one upstream delay: agents
				// are not in lock-step (500 calls at the same instant would
				// measure a burst's queue, direct or not).
				time.Sleep(time.Duration(s) * (delay + 10*time.Millisecond) / time.Duration(sessions))
				sid := fmt.Sprintf("bench-%d-%d:0", r, s)
				var d, v, dt, vt []time.Duration
				for i := range pairs {
					if (i+s)%2 == 0 { // alternate which goes first
						d = append(d, call(up.URL+"/v1/chat/completions", body, false))
						v = append(v, call(srv.URL+"/sessions/"+sid+"/v1/chat/completions", body, false))
					} else {
						v = append(v, call(srv.URL+"/sessions/"+sid+"/v1/chat/completions", body, false))
						d = append(d, call(up.URL+"/v1/chat/completions", body, false))
					}
					dt = append(dt, call(up.URL+"/v1/chat/completions", streamBody, true))
					vt = append(vt, call(srv.URL+"/sessions/"+sid+"/v1/chat/completions", streamBody, true))
				}
				mu.Lock()
				direct, via = append(direct, d...), append(via, v...)
				directT, viaT = append(directT, dt...), append(viaT, vt...)
				mu.Unlock()
			}()
		}
		t0 := time.Now()
		close(start)
		wg.Wait()
		return result{callsPerS: float64(2*sessions*pairs) / time.Since(t0).Seconds(),
			p50: us(pct(via, 50) - pct(direct, 50)), p99: us(pct(via, 99) - pct(direct, 99)),
			ttft50: us(pct(viaT, 50) - pct(directT, 50)), ttft99: us(pct(viaT, 99) - pct(directT, 99)),
		}
	}
	run(-1) // warm connections
	b.ResetTimer()
	var res []result
	for range b.N {
		res = res[:0]
		for r := range runs {
			res = append(res, run(r))
		}
	}
	b.StopTimer()
	report := func(get func(result) float64, name string) {
		xs := make([]float64, len(res))
		for i, r := range res {
			xs[i] = get(r)
		}
		slices.Sort(xs)
		b.ReportMetric(xs[len(xs)/2], name)
		b.ReportMetric(xs[len(xs)-1]-xs[0], name+"_spread")
	}
	report(func(r result) float64 { return r.p50 }, "p50_added_us")
	report(func(r result) float64 { return r.p99 }, "p99_added_us")
	report(func(r result) float64 { return r.ttft50 }, "ttft_p50_added_us")
	report(func(r result) float64 { return r.ttft99 }, "ttft_p99_added_us")
	report(func(r result) float64 { return r.callsPerS }, "gateway_calls_per_s")
	if paced && gw.pacer.admitted.Load() == 0 {
		b.Fatal("pacing admitted nothing")
	}
	if out.n.Load() == 0 {
		b.Fatal("nothing recorded")
	}
}

func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, len(s)*p/100)]
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// BenchmarkSessionMemory reports the heap an open session holds after one
// recorded call (its state and its in-memory trace; the record itself is
// gone to the output).
func BenchmarkSessionMemory(b *testing.B) {
	const n = 5000
	fx := fixtures(b)
	backend := gatewaytest.NewBackend(fx)
	backend.KeepRequests(false)
	up := httptest.NewServer(backend)
	defer up.Close()
	body := string(fx["vllm_chat"].Request)
	for range b.N {
		gw, err := New(Config{Upstreams: []string{up.URL}, HealthInterval: -1}, &countOutput{})
		if err != nil {
			b.Fatal(err)
		}
		h := gw.Handler()
		heap := func() uint64 {
			runtime.GC()
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			return m.HeapAlloc
		}
		before := heap()
		for i := range n {
			req := httptest.NewRequest("POST", fmt.Sprintf("/sessions/mem-%d:0/v1/chat/completions", i), strings.NewReader(body))
			h.ServeHTTP(httptest.NewRecorder(), req)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = gw.queue.drain(ctx)
		cancel()
		after := heap()
		b.ReportMetric(float64(after-before)/n, "bytes/session")
		runtime.KeepAlive(gw)
		_ = gw.Close(context.Background())
	}
}

// multiTurnBackend answers chat calls as vLLM does for a multi-turn agent
// whose prompt is the whole conversation: turn k (the number of assistant
// messages sent) has a prompt of 4,000 + 600k token ids and a 200-token
// answer with logprobs.
func multiTurnBackend() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		turn := strings.Count(string(body), `"assistant"`)
		prompt := make([]int64, 4000+600*turn)
		for i := range prompt {
			prompt[i] = int64(100 + i%50000)
		}
		var sb strings.Builder
		sb.WriteString(`{"id":"c","object":"chat.completion","model":"m","prompt_token_ids":`)
		sb.WriteString(strings.ReplaceAll(fmt.Sprint(prompt), " ", ","))
		sb.WriteString(`,"choices":[{"index":0,"message":{"role":"assistant","content":"`)
		sb.WriteString(strings.Repeat("word ", 200))
		sb.WriteString(`"},"logprobs":{"content":[`)
		ids := make([]string, 200)
		for i := range 200 {
			if i > 0 {
				sb.WriteByte(',')
			}
			fmt.Fprintf(&sb, `{"token":"w","logprob":-0.%d}`, i+1)
			ids[i] = fmt.Sprint(1000 + i)
		}
		sb.WriteString(`]},"finish_reason":"stop","token_ids":[` + strings.Join(ids, ",") + `]}],"usage":{"prompt_tokens":1,"completion_tokens":200}}`)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, sb.String())
	})
}

// BenchmarkMultiTurnSessionMemory: heap held per session of an 8-turn
// agent with 4k-token prompts growing 600 tokens a turn (the traces hold
// every call's prompt ids, what GET /sessions/{id}/traces returns), open
// and then finished, and the heap once finished sessions exceed
// MaxTraceBytes (16 MiB here): the bound, not the session count, sets it.
func BenchmarkMultiTurnSessionMemory(b *testing.B) {
	const sessions, turns = 80, 8
	up := httptest.NewServer(multiTurnBackend())
	defer up.Close()
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	for range b.N {
		gw, err := New(Config{Upstreams: []string{up.URL}, HealthInterval: -1, MaxTraceBytes: 16 << 20}, &countOutput{})
		if err != nil {
			b.Fatal(err)
		}
		h := gw.Handler()
		before := heap()
		for i := range sessions {
			msgs := `{"role":"user","content":"task"}`
			for range turns {
				req := httptest.NewRequest("POST", fmt.Sprintf("/sessions/mt-%d:0/v1/chat/completions", i),
					strings.NewReader(`{"model":"m","messages":[`+msgs+`]}`))
				h.ServeHTTP(httptest.NewRecorder(), req)
				msgs += `,{"role":"assistant","content":"a"},{"role":"user","content":"obs"}`
			}
			if i == sessions/2-1 {
				_, held := gw.sessions.usage()
				b.ReportMetric(float64(heap()-before)/float64(i+1), "bytes/open-session")
				b.ReportMetric(float64(held)/float64(i+1), "trace-bytes/open-session")
			}
		}
		for i := range sessions {
			req := httptest.NewRequest("POST", fmt.Sprintf("/sessions/mt-%d:0/finish", i), strings.NewReader(`{"reward":1}`))
			h.ServeHTTP(httptest.NewRecorder(), req)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = gw.queue.drain(ctx)
		cancel()
		_, held := gw.sessions.usage()
		b.ReportMetric(float64(held)/(1<<20), "trace-MiB-held")
		b.ReportMetric(float64(heap()-before)/(1<<20), "heap-MiB-after-finish")
		runtime.KeepAlive(gw)
		_ = gw.Close(context.Background())
	}
}
