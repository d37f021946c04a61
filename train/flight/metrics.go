package flight

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/rllm-pipe/rllm-pipe/train"
)

// stall is the share of m's time on the server it had no batch in flight:
// its trainer waiting for data (or for the network), as the server sees it.
func (m *member) stall(now time.Time) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	idle := m.idle
	if !m.idleSince.IsZero() {
		idle += now.Sub(m.idleSince)
	}
	wall := now.Sub(m.joined)
	if wall <= 0 {
		return 0
	}
	return float64(idle) / float64(wall)
}

// staleVersionsShown is how many policy versions of stale skips /metrics
// shows per consumer (the newest).
const staleVersionsShown = 16

// WriteMetrics writes the server's metrics in Prometheus' text format:
// per consumer (streaming now, or ended and remembered) its batches,
// groups acknowledged and skipped as stale, policy version and the
// freshness of its groups; per streaming member its data stall.
func (s *Server) WriteMetrics(w io.Writer) {
	now := time.Now()
	type row struct {
		st    train.Stats
		live  bool
		stall float64
	}
	rows := map[string]row{}
	s.mu.Lock()
	for name, l := range s.left {
		rows[name] = row{st: l.stats}
	}
	var live []*member
	for _, m := range s.members {
		if m != nil {
			live = append(live, m)
		}
	}
	s.mu.Unlock()
	for _, m := range live {
		rows[m.name] = row{st: m.c.Stats(), live: true, stall: m.stall(now)}
	}
	names := make([]string, 0, len(rows))
	for n := range rows {
		names = append(names, n)
	}
	sort.Strings(names)
	metric := func(name, typ, help string, val func(r row) (float64, bool)) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
		for _, n := range names { // consumer names are [A-Za-z0-9._-]: no escaping
			if v, ok := val(rows[n]); ok {
				fmt.Fprintf(w, "%s{consumer=%q} %g\n", name, n, v)
			}
		}
	}
	fmt.Fprintf(w, "# HELP rllm_serve_streams Streams (members) open now.\n# TYPE rllm_serve_streams gauge\nrllm_serve_streams %d\n", len(live))
	metric("rllm_serve_batches_total", "counter", "Batches delivered.", func(r row) (float64, bool) { return float64(r.st.Batches), true })
	metric("rllm_serve_groups_acked_total", "counter", "Groups acknowledged.", func(r row) (float64, bool) { return float64(r.st.GroupsAcked), true })
	metric("rllm_serve_groups_skipped_stale_total", "counter", "Groups skipped as staler than --max-staleness (rollouts thrown away).",
		func(r row) (float64, bool) { return float64(r.st.SkippedStale), true })
	metric("rllm_serve_groups_declined_stale_total", "counter", "Groups left to other members: staler than --max-staleness at the member's own version, within it at the capped one (--max-version-lead).",
		func(r row) (float64, bool) { return float64(r.st.DeclinedStale), true })
	fmt.Fprintf(w, "# HELP rllm_serve_groups_skipped_stale_by_version Groups skipped as stale, by their policy version (the newest %d versions per consumer).\n# TYPE rllm_serve_groups_skipped_stale_by_version counter\n", staleVersionsShown)
	for _, n := range names {
		by := rows[n].st.StaleByVersion
		vs := slices.Sorted(maps.Keys(by))
		for _, v := range vs[max(0, len(vs)-staleVersionsShown):] {
			fmt.Fprintf(w, "rllm_serve_groups_skipped_stale_by_version{consumer=%q,version=\"%d\"} %d\n", n, v, by[v])
		}
	}
	metric("rllm_serve_policy_version", "gauge", "The trainer's policy version, as it reported it.", func(r row) (float64, bool) { return float64(r.st.PolicyVersion), true })
	metric("rllm_serve_data_stall_ratio", "gauge", "Share of a streaming member's time with no batch in flight: its trainer waiting for data.",
		func(r row) (float64, bool) { return r.stall, r.live })
	metric("rllm_serve_freshness_groups_total", "counter", "Groups delivered with their finish time at the capture gateway.",
		func(r row) (float64, bool) { return float64(r.st.Freshness.Groups), true })
	fmt.Fprintf(w, "# HELP rllm_serve_freshness_seconds Age of the groups delivered: finished at the gateway -> delivered.\n# TYPE rllm_serve_freshness_seconds gauge\n")
	for _, n := range names {
		f := rows[n].st.Freshness
		if f.Groups == 0 {
			continue
		}
		fmt.Fprintf(w, "rllm_serve_freshness_seconds{consumer=%q,quantile=\"0.5\"} %g\n", n, f.P50Ms/1000)
		fmt.Fprintf(w, "rllm_serve_freshness_seconds{consumer=%q,quantile=\"0.99\"} %g\n", n, f.P99Ms/1000)
		fmt.Fprintf(w, "rllm_serve_freshness_seconds{consumer=%q,quantile=\"1\"} %g\n", n, f.MaxMs/1000)
	}
}
