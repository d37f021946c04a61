package main

// Chart buckets of the live view link to the trajectories behind them:
// every link of the staleness, advantage histogram, filtered groups (by
// version, and by commit) and throughput charts, followed, shows exactly
// what its bucket counts.

import (
	"html"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb/report/live"
)

// linkedPoint is a chart bucket with its link.
type linkedPoint struct {
	href string
	x, y float64
}

var linkedPointRe = regexp.MustCompile(`<a href="([^"]*)"><(?:rect|circle) class="(?:bar|pt)"[^>]*data-x="([^"]*)" data-y="([^"]*)"`)

// chartLinks reads the linked buckets of every chart of a page.
func chartLinks(t *testing.T, page string) map[string][]linkedPoint {
	t.Helper()
	out := map[string][]linkedPoint{}
	for _, m := range svgRe.FindAllStringSubmatch(page, -1) {
		for _, p := range linkedPointRe.FindAllStringSubmatch(m[0], -1) {
			x, _ := strconv.ParseFloat(p[2], 64)
			y, err := strconv.ParseFloat(p[3], 64)
			if err != nil {
				t.Fatalf("chart %s: y %q", m[1], p[3])
			}
			out[m[1]] = append(out[m[1]], linkedPoint{html.UnescapeString(p[1]), x, y})
		}
	}
	return out
}

func TestUIChartLinks(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	_, from := filteredFixture(t, bin, work)
	hs := liveServer(t, from, live.Options{PageSize: 100_000})
	links := chartLinks(t, httpBody(t, hs.URL+"/charts"))
	rowsOf := func(href string) [][]string {
		t.Helper()
		return browserRows(httpBody(t, hs.URL+href))
	}
	groupsOf := func(rows [][]string) int {
		g := map[string]bool{}
		for _, r := range rows {
			g[r[1]+"|"+r[0]] = true
		}
		return len(g)
	}
	query := func(href string) url.Values {
		u, err := url.Parse(href)
		if err != nil {
			t.Fatal(err)
		}
		return u.Query()
	}
	for _, id := range []string{"staleness", "advantage", "filtered", "filtered-time", "throughput"} {
		if len(links[id]) == 0 {
			t.Errorf("chart %s: no linked bucket", id)
		}
	}
	// Staleness: a bar's groups.
	for _, p := range links["staleness"] {
		rows := rowsOf(p.href)
		if n := groupsOf(rows); float64(n) != p.y {
			t.Errorf("staleness %v: %v groups on the chart, %d behind its link %s", p.x, p.y, n, p.href)
		}
		for _, r := range rows {
			if r[11] != strconv.FormatFloat(p.x, 'g', -1, 64) {
				t.Errorf("staleness %v links to %s, of staleness %s", p.x, r[2], r[11])
			}
		}
	}
	// The advantage histogram: a bin's trajectories, their advantages
	// within it.
	var sum float64
	for _, p := range links["advantage"] {
		rows := rowsOf(p.href)
		if float64(len(rows)) != p.y {
			t.Errorf("advantage bin at %v: %v trajectories on the chart, %d behind its link %s", p.x, p.y, len(rows), p.href)
		}
		sum += p.y
	}
	if all := len(rowsOf("/trajectories")); sum != float64(all) {
		t.Errorf("the advantage bins link to %v trajectories, the run has %d", sum, all)
	}
	// Filtered groups by version: a point's groups of its reason.
	for _, p := range links["filtered"] {
		if n := groupsOf(rowsOf(p.href)); float64(n) != p.y {
			t.Errorf("filtered at version %v: %v groups on the chart, %d behind its link %s", p.x, p.y, n, p.href)
		}
	}
	// Filtered over time: a point is a commit; its link, the commit's
	// groups of that reason (the report's "groups", the step of the
	// cumulative line).
	perCommit := map[string]float64{}
	for _, r := range sqlReport(t, bin, work, from, "filtered-over-time") {
		perCommit[jsonKey(r["seq"])+"|"+r["filter_reason"].(string)] = r["groups"].(float64)
	}
	for _, p := range links["filtered-time"] {
		q := query(p.href)
		want, ok := perCommit[q.Get("shard")+"|"+q.Get("reason")]
		if !ok {
			t.Errorf("filtered over time: link %s names no commit and reason of the report", p.href)
			continue
		}
		rows := rowsOf(p.href)
		if n := groupsOf(rows); float64(n) != want {
			t.Errorf("filtered over time, %s: the commit has %v groups of %s, %d behind the link", p.href, want, q.Get("reason"), n)
		}
		for _, r := range rows {
			if r[12] != q.Get("shard") || !strings.Contains(","+r[9]+",", ","+q.Get("reason")+",") {
				t.Errorf("filtered over time, %s: row %v", p.href, r)
			}
		}
	}
	// Throughput: a commit's trajectories hold its rows (steps).
	shardRows := map[string]float64{}
	for _, r := range sqlReport(t, bin, work, from, "throughput") {
		shardRows[jsonKey(r["seq"])] = r["rows"].(float64)
	}
	for _, p := range links["throughput"] {
		var steps float64
		for _, r := range rowsOf(p.href) {
			n, _ := strconv.ParseFloat(r[7], 64)
			steps += n
		}
		if seq := query(p.href).Get("shard"); steps != shardRows[seq] || steps == 0 {
			t.Errorf("throughput, %s: %v steps behind the link, the shard has %v rows", p.href, steps, shardRows[seq])
		}
	}
}
