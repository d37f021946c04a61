package gateway

import (
	"fmt"
	"io"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// counterVec is a counter with one label, created on first use.
type counterVec struct {
	m sync.Map // label value → *atomic.Int64
}

func (c *counterVec) inc(label string) { c.add(label, 1) }

func (c *counterVec) add(label string, n int64) {
	v, ok := c.m.Load(label)
	if !ok {
		v, _ = c.m.LoadOrStore(label, new(atomic.Int64))
	}
	v.(*atomic.Int64).Add(n)
}

func (c *counterVec) snapshot() map[string]int64 {
	out := map[string]int64{}
	c.m.Range(func(k, v any) bool { out[k.(string)] = v.(*atomic.Int64).Load(); return true })
	return out
}

// histogram is a fixed-bucket Prometheus histogram in seconds.
type histogram struct {
	bounds []float64
	counts []atomic.Int64 // one per bound, plus +Inf
	sumNS  atomic.Int64
}

func newHistogram(bounds ...float64) *histogram {
	return &histogram{bounds: bounds, counts: make([]atomic.Int64, len(bounds)+1)}
}

func (h *histogram) observe(d time.Duration) {
	if d < 0 {
		d = 0
	}
	s := d.Seconds()
	i := sort.SearchFloat64s(h.bounds, s)
	h.counts[i].Add(1)
	h.sumNS.Add(int64(d))
}

// metrics are the gateway's Prometheus metrics (text exposition at /metrics).
type metrics struct {
	calls          counterVec // kind: recorded, passthrough, plain
	steps          atomic.Int64
	forks          atomic.Int64 // steps whose prompt does not extend the previous step's
	rejected       counterVec   // gateway_reject reason
	cutOff         counterVec   // cause
	errors         counterVec   // kind
	promptTokens   atomic.Int64
	complTokens    atomic.Int64
	unrecordedN    atomic.Int64
	tracesEvicted  atomic.Int64
	recordsDurable atomic.Int64
	recordsPosted  atomic.Int64
	bufferBytes    atomic.Int64
	bufferRecords  atomic.Int64
	bufferLimit    atomic.Int64
	added          *histogram
}

func newMetrics() *metrics {
	return &metrics{added: newHistogram(50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3)}
}

func (m *metrics) write(w io.Writer, sessionsOpen int, traceBytes int64, weight int64, workers []WorkerInfo) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	vec := func(name, help, label string, c *counterVec) {
		p("# HELP %s %s\n# TYPE %s counter\n", name, help, name)
		snap := c.snapshot()
		keys := make([]string, 0, len(snap))
		for k := range snap {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			p("%s{%s=%q} %d\n", name, label, k, snap[k])
		}
	}
	one := func(name, typ, help string, v int64) {
		p("# HELP %s %s\n# TYPE %s %s\n%s %d\n", name, help, name, typ, name, v)
	}
	vec("rllm_gateway_calls_total", "Agent calls by kind: recorded (in a session), passthrough (other routes in a session), plain (outside a session).", "kind", &m.calls)
	one("rllm_gateway_steps_recorded_total", "counter", "Step records queued for the output.", m.steps.Load())
	one("rllm_gateway_prompt_forks_total", "counter", "Steps whose prompt does not extend the previous step's prompt and answer (re-rendered history, context resets): recorded whole, with where they diverge.", m.forks.Load())
	vec("rllm_gateway_rejected_steps_total", "Steps written so that ingest dead-letters them, by reason (null_logprob, logprob_count, missing_token_ids, unreadable_response).", "reason", &m.rejected)
	vec("rllm_gateway_cut_off_steps_total", "Steps whose agent did not get the whole answer, by cause (client_disconnect, upstream_cut).", "cause", &m.cutOff)
	vec("rllm_gateway_errors_total", "Errors by kind.", "kind", &m.errors)
	one("rllm_gateway_prompt_tokens_total", "counter", "Prompt tokens of recorded calls.", m.promptTokens.Load())
	one("rllm_gateway_completion_tokens_total", "counter", "Response tokens of recorded calls.", m.complTokens.Load())
	one("rllm_gateway_choices_unrecorded_total", "counter", "Choices beyond the first of n > 1 calls (proxied, not recorded).", m.unrecordedN.Load())
	one("rllm_gateway_traces_evicted_total", "counter", "In-memory traces evicted by the trace bounds (the output keeps them).", m.tracesEvicted.Load())
	one("rllm_gateway_records_posted_total", "counter", "Records taken by POST /records.", m.recordsPosted.Load())
	one("rllm_gateway_records_durable_total", "counter", "Records the output acknowledged.", m.recordsDurable.Load())
	one("rllm_gateway_buffer_bytes", "gauge", "Bytes of records waiting for the output.", m.bufferBytes.Load())
	one("rllm_gateway_buffer_records", "gauge", "Records waiting for a writer.", m.bufferRecords.Load())
	one("rllm_gateway_buffer_limit_bytes", "gauge", "MaxBufferedBytes: beyond it agents get 503.", m.bufferLimit.Load())
	lim := m.bufferLimit.Load()
	fill := 0.0
	if lim > 0 {
		fill = float64(m.bufferBytes.Load()) / float64(lim)
	}
	p("# HELP rllm_gateway_buffer_fill_ratio Buffered bytes over the limit.\n# TYPE rllm_gateway_buffer_fill_ratio gauge\nrllm_gateway_buffer_fill_ratio %g\n", fill)
	one("rllm_gateway_sessions_open", "gauge", "Sessions known and not finished.", int64(sessionsOpen))
	one("rllm_gateway_trace_bytes", "gauge", "Bytes of the in-memory traces and finished sessions, bounded by MaxTraceBytes.", traceBytes)
	one("rllm_gateway_weight_version", "gauge", "Weight version stamped on calls dispatched now.", weight)
	p("# HELP rllm_gateway_worker_healthy Worker health (1 healthy).\n# TYPE rllm_gateway_worker_healthy gauge\n")
	for _, wk := range workers {
		h := 0
		if wk.Healthy {
			h = 1
		}
		p("rllm_gateway_worker_healthy{worker_id=%q} %d\n", wk.WorkerID, h)
	}
	name := "rllm_gateway_latency_added_seconds"
	p("# HELP %s Time the gateway adds to a call: handler time minus the upstream exchange.\n# TYPE %s histogram\n", name, name)
	var cum int64
	for i, b := range m.added.bounds {
		cum += m.added.counts[i].Load()
		p("%s_bucket{le=\"%g\"} %d\n", name, b, cum)
	}
	cum += m.added.counts[len(m.added.bounds)].Load()
	p("%s_bucket{le=\"+Inf\"} %d\n%s_sum %g\n%s_count %d\n", name, cum, name, float64(m.added.sumNS.Load())/1e9, name, cum)
}
