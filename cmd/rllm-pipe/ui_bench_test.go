package main

import (
	"context"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors"
	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb"
	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb/report"
	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb/report/live"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
)

// offsetPageSQL is how the browser paged before its index: the
// trajectories view (a fold of every step) with LIMIT/OFFSET, run here
// side by side with the index as the baseline.
const offsetPageSQL = `SELECT group_id, group_version, trajectory_id, task_id, coalesce(role, '') AS role, reward, advantage, steps,
  response_tokens, coalesce(filter_reason, '') AS filter_reason, pass
FROM trajectories
WHERE ($1 = '' OR task_id = $1) AND ($2::BIGINT IS NULL OR group_version = $2::BIGINT)
ORDER BY group_version, group_id, trajectory_id
LIMIT 51 OFFSET $3`

// BenchmarkUIBrowse measures the trajectory browser of `rllm-pipe ui` on a
// store of about a million steps (gen + ingest into a temporary folder,
// removed afterwards; RLLM_UI_BENCH_GROUPS groups of 8, default 50000;
// see uiBenchStore):
// one refresh (open, build the trajectory index, run the reports), then,
// over HTTP, the first page, the next page, a page 1000 pages deep, a
// filter change (one task) and opening a trajectory, each 3 times,
// alternated with the same pages read the old way (the trajectories view
// with OFFSET) in the same run. Metrics: the median in ms, and its
// spread as -min-ms and -max-ms.
//
//	go test -run '^$' -bench UIBrowse -benchtime 1x -timeout 60m ./cmd/rllm-pipe/
func BenchmarkUIBrowse(b *testing.B) {
	ctx := context.Background()
	r := uiBenchReader(ctx, b)
	srv := live.New(r, live.Options{PageSize: 50})
	defer srv.Close()
	t0 := time.Now()
	if err := srv.Refresh(ctx); err != nil {
		b.Fatal(err)
	}
	refresh := time.Since(t0)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()

	get := func(path string) string {
		resp, err := http.Get(hs.URL + path)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
		}
		return string(body)
	}
	first := get("/trajectories")
	next := html.UnescapeString(regexp.MustCompile(`<a id="next" href="([^"]*)"`).FindStringSubmatch(first)[1])
	open := html.UnescapeString(regexp.MustCompile(`<a href="(/trajectory\?[^"]*)"`).FindStringSubmatch(first)[1])
	task := regexp.MustCompile(`<tr class="traj">(?:<td>[^<]*</td>){2}<td><a [^>]*>[^<]*</a></td><td>([^<]*)</td>`).FindStringSubmatch(first)[1]
	// The row 50,000 trajectories in, as the page 1000 pages deep starts.
	db, err := duckdb.Open(ctx, r, duckdb.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	deepRow, err := report.RunTable(ctx, db, "deep", offsetPageSQL, "", nil, 50*1000-1)
	if err != nil || len(deepRow.Rows) == 0 {
		b.Fatalf("deep row: %v", err)
	}
	dr := deepRow.Rows[0]
	deep := "/trajectories?page=1000&after_v=" + report.FormatCell(dr[1]) + "&after_g=" + report.Str(dr[0]) + "&after_t=" + report.Str(dr[2])
	steps, traj := 0, 0
	if t, err := report.RunTable(ctx, db, "count", "SELECT count(*), (SELECT count(*) FROM trajectories) FROM steps"); err == nil {
		s, _ := report.Num(t.Rows[0][0])
		tr, _ := report.Num(t.Rows[0][1])
		steps, traj = int(s), int(tr)
	}

	type op struct {
		name string
		run  func()
	}
	sqlOp := func(args ...any) func() {
		return func() {
			if _, err := report.RunTable(ctx, db, "offset", offsetPageSQL, args...); err != nil {
				b.Fatal(err)
			}
		}
	}
	httpOp := func(path string) func() { return func() { get(path) } }
	ops := []op{
		{"first-page", httpOp("/trajectories")},
		{"offset-first-page", sqlOp("", nil, 0)},
		{"next-page", httpOp(next)},
		{"offset-next-page", sqlOp("", nil, 50)},
		{"deep-page", httpOp(deep)},
		{"offset-deep-page", sqlOp("", nil, 50*1000)},
		{"filter-task", httpOp("/trajectories?task=" + task)},
		{"offset-filter-task", sqlOp(task, nil, 0)},
		{"open-trajectory", httpOp(open)},
	}
	times := map[string][]float64{}
	b.ResetTimer()
	for range b.N {
		for range 3 {
			for _, o := range ops {
				t0 := time.Now()
				o.run()
				times[o.name] = append(times[o.name], float64(time.Since(t0).Microseconds())/1000)
			}
		}
	}
	b.StopTimer()
	b.Logf("%d steps, %d trajectories; refresh (open, index, reports) %.1f s", steps, traj, refresh.Seconds())
	b.ReportMetric(float64(steps), "steps")
	b.ReportMetric(refresh.Seconds(), "refresh-s")
	for _, o := range ops {
		ts := slices.Clone(times[o.name])
		slices.Sort(ts)
		med := ts[len(ts)/2]
		b.Logf("%-20s median %9.1f ms (min %9.1f, max %9.1f, %d runs)", o.name, med, ts[0], ts[len(ts)-1], len(ts))
		b.ReportMetric(med, o.name+"-ms")
		b.ReportMetric(ts[0], o.name+"-min-ms")
		b.ReportMetric(ts[len(ts)-1], o.name+"-max-ms")
	}
}

// uiBenchStore generates and ingests RLLM_UI_BENCH_GROUPS groups of 8
// (default 50000: about a million steps) into a temporary folder removed
// after the benchmark, and returns the output root; RLLM_UI_BENCH_STORE
// names an existing one to use instead.
// uiBenchReader opens the benchmark store (uiBenchStore), closed at the
// end of the benchmark.
func uiBenchReader(ctx context.Context, b *testing.B) store.Reader {
	b.Helper()
	root, err := connectors.ParseRoot(uiBenchStore(b), connectors.Options{})
	if err != nil {
		b.Fatal(err)
	}
	r, err := connectors.OpenReader(ctx, root, "ui-bench")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.Close() })
	return r
}

func uiBenchStore(b *testing.B) string {
	b.Helper()
	if out := os.Getenv("RLLM_UI_BENCH_STORE"); out != "" {
		return out
	}
	groups := 50000
	if v := os.Getenv("RLLM_UI_BENCH_GROUPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("RLLM_UI_BENCH_GROUPS=%q", v)
		}
		groups = n
	}
	bin := benchBinary(b)
	work := b.TempDir()
	in, out := filepath.Join(work, "in.jsonl"), filepath.Join(work, "out")
	for _, args := range [][]string{
		{"gen", "--to", in, "--groups", strconv.Itoa(groups), "--group-size", "8", "--prompt-len", "32", "--response-len", "24",
			"--policy-versions", "50", "--seed", "1", "--quiet"},
		{"ingest", "--from", in, "--to", out, "--group-size", "8", "--quiet"},
	} {
		cmd := exec.Command(bin, args...)
		cmd.Env = e2eEnv()
		if o, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("%s: %v\n%s", args[0], err, o)
		}
	}
	os.Remove(in)
	return out
}
