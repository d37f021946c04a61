package main

// Consumer-group tests through the real binary: `rllm-pipe consume`
// members run as child processes over committed shards (a local directory
// or MinIO), one of them is killed with SIGKILL, members restart; what they
// print is checked against the shards read back independently with DuckDB,
// and the group's log is replayed with train.GroupProgress.

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/minio/minio-go/v7"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/train"
)

// consMaxTokens is the members' --max-tokens. The generated groups (see
// consGenChunks) hold about 2,000 to 12,000 tokens: batches of one, two
// and three groups, and a few oversized ones.
const consMaxTokens = 8000

// consGroup is what DuckDB says of one committed group (over the rows a
// consumer delivers: filter_reason null).
type consGroup struct {
	rows, tokens, version int64
}

// consData is the committed data: every group, and the number of shards.
type consData struct {
	groups map[string]consGroup
	shards int
}

// consLine is one line of `consume --format jsonl` (decoded independently
// of the command's own type).
type consLine struct {
	BatchID   uint64   `json:"batch_id"`
	Groups    []string `json:"groups"`
	Rows      int64    `json:"rows"`
	Tokens    int64    `json:"tokens"`
	Oversized bool     `json:"oversized"`
	Step      struct {
		Step   uint64 `json:"step"`
		Part   int    `json:"part"`
		Parts  int    `json:"parts"`
		Groups int    `json:"groups"`
	} `json:"step"`
}

// consGenChunks generates groups of 4 with `rllm-pipe gen` (plus genArgs)
// and splits the records into n files by task (task index mod n), each
// file holding whole groups, in generation order: ingesting the files one
// after the other gives many shards (one per policy version and file).
func consGenChunks(t *testing.T, bin, work string, n int, genArgs ...string) []string {
	t.Helper()
	in := filepath.Join(work, "gen.jsonl")
	args := append([]string{"gen", "--to", in, "--group-size", "4", "--prompt-len", "80", "--response-len", "40",
		"--max-steps", "6", "--messages=false", "--quiet"}, genArgs...)
	if r := e2eRun(t, bin, work, args...); r.code != 0 {
		t.Fatalf("gen: exit %d\n%s", r.code, r.stderr)
	}
	data, err := os.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	parts := make([][][]byte, n)
	for _, l := range e2eSplitLines(data) {
		i := genTask(t, l)
		parts[i%n] = append(parts[i%n], l)
	}
	var files []string
	for i, p := range parts {
		f := filepath.Join(work, fmt.Sprintf("chunk-%02d.jsonl", i))
		if err := os.WriteFile(f, e2eJoinLines(p), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

// consIngest ingests the files one after the other into to and returns the
// number of groups written (from --stats-json).
func consIngest(t *testing.T, bin, work, to string, files []string, extra ...string) int64 {
	t.Helper()
	var written int64
	for _, f := range files {
		st := ingestWithStats(t, bin, work, nil, append([]string{"--from", f, "--to", to, "--group-size", "4", "--flush-interval", "30ms"}, extra...)...)
		if st.DeadLettersTotal != 0 {
			t.Fatalf("ingest %s: %d dead letters (generated input is clean)", f, st.DeadLettersTotal)
		}
		written += st.GroupsEmitted
	}
	return written
}

// consCommitted reads the shards at paths (the committed shards of
// entries, in the same order) with DuckDB: tokens and rows of every group
// over the rows a consumer delivers (filter_reason null). It cross-checks
// the manifest entries' group keys and counts and the ingest's
// groups_written against it.
func consCommitted(t *testing.T, entries []schemas.ShardEntry, paths []string, written int64) consData {
	t.Helper()
	if len(paths) == 0 {
		t.Fatal("no committed shards")
	}
	db, err := sql.Open("duckdb", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(fmt.Sprintf(`SELECT group_id,
			count(*) FILTER (WHERE filter_reason IS NULL),
			coalesce(sum(coalesce(len(prompt_ids), prompt_prefix_len + len(prompt_delta_ids)) + coalesce(len(response_ids), 0)) FILTER (WHERE filter_reason IS NULL), 0),
			count(*) FILTER (WHERE filter_reason IS NOT NULL),
			min(group_version), max(group_version), count(DISTINCT filename)
		FROM read_parquet(%s, hive_partitioning=false, filename=true)
		GROUP BY group_id`, e2eSQLList(paths)))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	d := consData{groups: map[string]consGroup{}, shards: len(paths)}
	for rows.Next() {
		var (
			id                              string
			n, tokens, filtered, vmin, vmax int64
			files                           int64
		)
		if err := rows.Scan(&id, &n, &tokens, &filtered, &vmin, &vmax, &files); err != nil {
			t.Fatal(err)
		}
		// Preconditions of the expectations below, not properties under test.
		if filtered != 0 {
			t.Fatalf("group %s: %d rows marked by a filter (ingest ran without --filter)", id, filtered)
		}
		if vmin != vmax {
			t.Fatalf("group %s: group_version from %d to %d", id, vmin, vmax)
		}
		if files != 1 {
			t.Fatalf("group %s is in %d shards", id, files)
		}
		d.groups[id] = consGroup{rows: n, tokens: tokens, version: vmin}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	listed := 0
	for _, e := range entries {
		listed += e.Groups
		for _, k := range e.GroupKeys {
			keys[k] = true
		}
	}
	if listed != len(d.groups) || len(keys) != len(d.groups) || written != int64(len(d.groups)) {
		t.Fatalf("DuckDB reads %d groups; the manifest counts %d and lists %d keys; ingest wrote %d", len(d.groups), listed, len(keys), written)
	}
	for k := range keys {
		if _, ok := d.groups[k]; !ok {
			t.Fatalf("the manifest lists group %q, which DuckDB does not read", k)
		}
	}
	return d
}

// consLocal reads the committed shards under out (listed by its manifest).
func consLocal(t *testing.T, out string, written int64) consData {
	t.Helper()
	all, err := local.ReadManifest(out)
	if err != nil {
		t.Fatal(err)
	}
	var (
		entries []schemas.ShardEntry
		paths   []string
	)
	for _, e := range all {
		if e.Path != "" {
			entries = append(entries, e)
			paths = append(paths, filepath.Join(out, filepath.FromSlash(e.Path)))
		}
	}
	return consCommitted(t, entries, paths, written)
}

// consLocalProgress replays the log of consumer group g under out.
func consLocalProgress(t *testing.T, out, g string) train.Progress {
	t.Helper()
	sh, err := local.OpenReader(out)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := sh.Objects(train.GroupDir(g))
	if err != nil {
		t.Fatal(err)
	}
	p, err := train.GroupProgress(context.Background(), obj)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// consProc is a `rllm-pipe consume` child process.
type consProc struct {
	name, out, stats string
	cmd              *exec.Cmd
	stderr           *syncBuffer
	done             chan struct{}
	err              error // from Wait, once done is closed
	ended            time.Time
}

// consStart starts member name writing its batches (jsonl) to
// work/<name>.jsonl and its tallies to work/<name>-stats.json.
func consStart(t *testing.T, bin, work, name string, args ...string) *consProc {
	t.Helper()
	p, _ := consLaunch(t, bin, work, name, false, append([]string{"--format", "jsonl", "--to", filepath.Join(work, name+".jsonl")}, args...)...)
	return p
}

// consLaunch starts member name with its tallies to work/<name>-stats.json;
// with pipe, its standard output is returned to read.
func consLaunch(t *testing.T, bin, work, name string, pipe bool, args ...string) (*consProc, io.Reader) {
	t.Helper()
	p := &consProc{name: name, out: filepath.Join(work, name+".jsonl"), stats: filepath.Join(work, name+"-stats.json"),
		stderr: &syncBuffer{}, done: make(chan struct{})}
	full := append([]string{"consume", "--name", name, "--stats-json", p.stats}, args...)
	p.cmd = exec.Command(bin, full...)
	p.cmd.Dir = work
	p.cmd.Env = e2eEnv()
	p.cmd.Stderr = p.stderr
	var stdout *os.File
	if pipe {
		// Not cmd.StdoutPipe: Wait would close it, maybe before everything
		// was read. The read end reaches EOF when the child exits.
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		p.cmd.Stdout, stdout = w, r
		defer w.Close()
	} else {
		p.cmd.Stdout = p.stderr
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		p.ended = time.Now()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	if stdout == nil {
		return p, nil
	}
	return p, stdout
}

// wait waits for the member to exit by deadline (killing it and failing
// otherwise) and requires exit code 0.
func (p *consProc) wait(t *testing.T, deadline time.Time) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(time.Until(deadline)):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Fatalf("member %s did not finish in time; output:\n%s", p.name, e2eClip(p.stderr.String(), 4000))
	}
	if p.err != nil {
		t.Fatalf("member %s: %v; output:\n%s", p.name, p.err, e2eClip(p.stderr.String(), 4000))
	}
}

// kill waits until the member has printed at least n batches, then kills
// it with SIGKILL; it fails if the member exits on its own first.
func (p *consProc) kill(t *testing.T, n int, deadline time.Time) time.Time {
	t.Helper()
	for {
		data, _ := os.ReadFile(p.out)
		if bytes.Count(data, []byte{'\n'}) >= n {
			break
		}
		select {
		case <-p.done:
			t.Fatalf("member %s exited (%v) before printing %d batches; output:\n%s", p.name, p.err, n, e2eClip(p.stderr.String(), 4000))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("member %s printed fewer than %d batches in time", p.name, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	at := time.Now()
	<-p.done
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("member %s was not killed (%v): it finished first; output:\n%s", p.name, p.err, e2eClip(p.stderr.String(), 4000))
	}
	return at
}

// lines reads the member's batches. A killed member may have left a last
// line without its newline: with partialOK it is dropped (that batch was
// not acknowledged: consume acknowledges after writing the whole line).
func (p *consProc) lines(t *testing.T, partialOK bool) []consLine {
	t.Helper()
	data, err := os.ReadFile(p.out)
	if errors.Is(err, fs.ErrNotExist) && partialOK {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	if i := bytes.LastIndexByte(data, '\n'); i+1 < len(data) {
		if !partialOK {
			t.Fatalf("member %s: output ends in a partial line %q", p.name, e2eClip(string(data[i+1:]), 200))
		}
		t.Logf("member %s: dropped a partial last line", p.name)
		data = data[:i+1]
	}
	var out []consLine
	for _, l := range e2eSplitLines(data) {
		var cl consLine
		dec := json.NewDecoder(bytes.NewReader(l))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cl); err != nil {
			t.Fatalf("member %s: line %q: %v", p.name, e2eClip(string(l), 200), err)
		}
		out = append(out, cl)
	}
	return out
}

// tallies reads the member's --stats-json and checks that the summary line
// on stderr says the same.
func (p *consProc) tallies(t *testing.T) train.Stats {
	t.Helper()
	data, err := os.ReadFile(p.stats)
	if err != nil {
		t.Fatalf("member %s: %v", p.name, err)
	}
	var st train.Stats
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatalf("member %s: stats: %v", p.name, err)
	}
	s := consSummary(t, p.name, p.stderr.String())
	if s.batches != st.Batches || s.acked != st.GroupsAcked || s.lost != st.GroupsLost || s.stale != st.SkippedStale ||
		s.empty != st.SkippedEmpty || s.oversized != st.Oversized || s.takeovers != st.Takeovers {
		t.Errorf("member %s: summary %+v disagrees with --stats-json %s", p.name, s, data)
	}
	return st
}

var consSummaryRE = regexp.MustCompile(`consume: (\d+) batches, (\d+) groups acknowledged, (\d+) lost, (\d+) stale and (\d+) empty skipped, (\d+) filtered rows, (\d+) oversized, (\d+) shards taken over`)

type consSummaryLine struct {
	batches, acked, lost, stale, empty, filtered, oversized, takeovers int64
}

func consSummary(t *testing.T, who, stderr string) consSummaryLine {
	t.Helper()
	m := consSummaryRE.FindStringSubmatch(stderr)
	if m == nil {
		t.Fatalf("member %s: no summary line on stderr:\n%s", who, e2eClip(stderr, 4000))
	}
	n := make([]int64, len(m)-1)
	for i := range n {
		n[i], _ = strconv.ParseInt(m[i+1], 10, 64)
	}
	return consSummaryLine{n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7]}
}

// consCheckLines checks batches against the committed groups: every group
// known, the batch's tokens and rows the sums of its groups' (so a
// single-group batch has exactly the tokens DuckDB counts), the budget
// kept except by a batch of one oversized group, flagged as such.
func consCheckLines(t *testing.T, who string, lines []consLine, d consData) (single, multi, oversized int) {
	t.Helper()
	bad := 0
	for _, l := range lines {
		var tokens, rows int64
		known := len(l.Groups) > 0
		for _, g := range l.Groups {
			cg, ok := d.groups[g]
			if !ok {
				known = false
				continue
			}
			tokens += cg.tokens
			rows += cg.rows
		}
		var problems []string
		if !known {
			problems = append(problems, "a group that is not committed (or none)")
		} else {
			if l.Tokens != tokens {
				problems = append(problems, fmt.Sprintf("tokens %d, DuckDB counts %d", l.Tokens, tokens))
			}
			if l.Rows != rows {
				problems = append(problems, fmt.Sprintf("rows %d, DuckDB counts %d", l.Rows, rows))
			}
		}
		over := l.Tokens > consMaxTokens
		if over && (!l.Oversized || len(l.Groups) != 1) {
			problems = append(problems, "over the budget")
		}
		if l.Oversized && (!over || len(l.Groups) != 1) {
			problems = append(problems, "flagged oversized")
		}
		if l.BatchID != 0 && (l.Step.Step == 0 || l.Step.Part != 0 || l.Step.Parts != 1 || l.Step.Groups != len(l.Groups)) { // consume's lines (not the Flight client's below)
			problems = append(problems, fmt.Sprintf("step %+v: want a step of its own, of its groups", l.Step))
		}
		if len(problems) > 0 {
			if bad++; bad <= 10 {
				t.Errorf("member %s: batch %+v: %s", who, l, strings.Join(problems, "; "))
			}
			continue
		}
		switch {
		case l.Oversized:
			oversized++
		case len(l.Groups) == 1:
			single++
		default:
			multi++
		}
	}
	if bad > 10 {
		t.Errorf("member %s: %d bad batches in all", who, bad)
	}
	return single, multi, oversized
}

// consGroupsOf counts the groups of lines.
func consGroupsOf(lines []consLine, into map[string]int) int {
	n := 0
	for _, l := range lines {
		for _, g := range l.Groups {
			into[g]++
			n++
		}
	}
	return n
}

// consSameSet reports the difference of got and want.
func consSameSet(t *testing.T, what string, got map[string]int, want map[string]bool) {
	t.Helper()
	var missing, extra []string
	for g := range want {
		if got[g] == 0 {
			missing = append(missing, g)
		}
	}
	for g := range got {
		if !want[g] {
			extra = append(extra, g)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 || len(extra) > 0 {
		t.Errorf("%s: %d groups missing %s, %d unexpected %s (of %d)", what, len(missing), e2eClipList(missing), len(extra), e2eClipList(extra), len(want))
	}
}

func consAll(d consData) map[string]bool {
	all := make(map[string]bool, len(d.groups))
	for g := range d.groups {
		all[g] = true
	}
	return all
}

// consKillOneMember runs three members of group "g" over from, kills one
// with SIGKILL once it has printed 25 batches (of about 300), waits for
// the other two to finish on their own, and checks the outcome against d
// and the group's log (progress).
func consKillOneMember(t *testing.T, bin, work, from string, extra []string, d consData, progress func() train.Progress) {
	t.Helper()
	const lease = 2 * time.Second
	args := append([]string{"--from", from, "--consumer-group", "g", "--max-tokens", strconv.Itoa(consMaxTokens),
		"--lease-timeout", lease.String(), "--poll", "100ms"}, extra...)
	began := time.Now()
	deadline := began.Add(50 * time.Second)
	var procs []*consProc
	for _, name := range []string{"c1", "c2", "c3"} {
		procs = append(procs, consStart(t, bin, work, name, args...))
	}
	victim, survivors := procs[1], []*consProc{procs[0], procs[2]}
	killedAt := victim.kill(t, 25, deadline)
	for _, s := range survivors {
		s.wait(t, deadline)
	}
	t.Logf("killed %s %v after the start; survivors finished %v and %v after the kill",
		victim.name, killedAt.Sub(began).Round(time.Millisecond), survivors[0].ended.Sub(killedAt).Round(time.Millisecond),
		survivors[1].ended.Sub(killedAt).Round(time.Millisecond))

	all := consAll(d)
	seen := map[string]int{}
	vLines := victim.lines(t, true)
	consGroupsOf(vLines, seen)
	single, multi, oversized := consCheckLines(t, victim.name, vLines, d)

	// Survivors: every batch acknowledged, none refused, no group twice
	// (not even across the two), and the dead member's shards taken over.
	bySurvivors := map[string]int{}
	var acked, takeovers int64
	for _, s := range survivors {
		lines := s.lines(t, false)
		s1, m1, o1 := consCheckLines(t, s.name, lines, d)
		single, multi, oversized = single+s1, multi+m1, oversized+o1
		own := map[string]int{}
		printed := consGroupsOf(lines, own)
		consGroupsOf(lines, bySurvivors)
		consGroupsOf(lines, seen)
		for g, n := range own {
			if n > 1 {
				t.Errorf("member %s printed group %s %d times", s.name, g, n)
			}
		}
		st := s.tallies(t)
		if st.GroupsLost != 0 {
			t.Errorf("member %s: %d groups' acknowledgements refused (it never stopped renewing)", s.name, st.GroupsLost)
		}
		if st.GroupsAcked != int64(printed) || st.Batches != int64(len(lines)) {
			t.Errorf("member %s printed %d batches of %d groups, reports %d batches and %d groups acknowledged",
				s.name, len(lines), printed, st.Batches, st.GroupsAcked)
		}
		acked += st.GroupsAcked
		takeovers += st.Takeovers
	}
	for g, n := range bySurvivors {
		if n > 1 {
			t.Errorf("group %s printed %d times by the survivors", g, n)
		}
	}
	if takeovers == 0 {
		t.Errorf("the survivors took over no shard of the killed member")
	}
	// The dead member's leases were respected: its last renewal was at most
	// a third of the lease before the kill, so its shards could not move
	// for two thirds of the lease after it.
	for _, s := range survivors {
		if s.ended.Sub(killedAt) < lease/2 {
			t.Errorf("member %s finished %v after the kill, before the dead member's lease (%v) could expire",
				s.name, s.ended.Sub(killedAt), lease)
		}
	}

	// Every committed group printed; the only groups printed twice are
	// those of the killed member's last batch, when its acknowledgement did
	// not happen: then all of them (consume acknowledges each batch before
	// printing the next).
	consSameSet(t, "printed by the three members", seen, all)
	var last []string
	if len(vLines) > 0 {
		last = vLines[len(vLines)-1].Groups
	}
	inLast := map[string]bool{}
	for _, g := range last {
		inLast[g] = true
	}
	var twice []string
	for g, n := range seen {
		if n > 2 || (n == 2 && !inLast[g]) {
			t.Errorf("group %s printed %d times (the killed member's last batch: %v)", g, n, last)
		}
		if n >= 2 {
			twice = append(twice, g)
		}
	}
	if len(twice) != 0 && len(twice) != len(last) {
		t.Errorf("groups printed twice: %v; want none or all of the killed member's last batch %v", twice, last)
	}
	// The killed member acknowledged what it printed but the doubled groups.
	if want := int64(len(all)) - acked; want != int64(consGroupsOf(vLines, map[string]int{})-len(twice)) {
		t.Errorf("the survivors acknowledged %d groups of %d, the killed member printed %d and %d were printed again",
			acked, len(all), consGroupsOf(vLines, map[string]int{}), len(twice))
	}

	// The log: every group acknowledged exactly once, every shard done.
	p := progress()
	if p.GroupsAcked != int64(len(all)) || p.GroupsSkip != 0 || p.Shards != d.shards || p.Done != d.shards || p.Leased != 0 {
		t.Errorf("progress %+v; want %d groups acknowledged, none skipped, %d shards all done", p, len(all), d.shards)
	}
	if single == 0 || multi == 0 {
		t.Errorf("the data did not exercise the budget: %d single-group, %d multi-group batches", single, multi)
	}
	t.Logf("%d groups in %d shards; %d printed by the killed member (%d lines), %d again after it; batches: %d single, %d multi-group, %d oversized; %d takeovers, %d log events",
		len(all), d.shards, consGroupsOf(vLines, map[string]int{}), len(vLines), len(twice), single, multi, oversized, takeovers, p.Events)
}

// TestConsumeGroupKillOneMember: three members of a consumer group over a
// local directory, one killed with SIGKILL mid-way; the other two take its
// shards over after the lease timeout and finish, and every group is
// printed and acknowledged, once but for the dead member's unacknowledged
// batch.
func TestConsumeGroupKillOneMember(t *testing.T) {
	// Not parallel: its members renew 2 s leases (see main_test.go).
	bin := e2eBinary(t)
	work := t.TempDir()
	out := filepath.Join(work, "out")
	chunks := consGenChunks(t, bin, work, 8, "--groups", "400", "--seed", "3")
	written := consIngest(t, bin, work, out, chunks, "--shard-size", "256KiB")
	d := consLocal(t, out, written)
	if d.shards < 12 {
		t.Fatalf("only %d shards: the members would not share much", d.shards)
	}
	consKillOneMember(t, bin, work, out, nil, d, func() train.Progress { return consLocalProgress(t, out, "g") })
}

// TestConsumeRestartResumes: a member stopped after some batches (cleanly,
// or killed) and started again under its name delivers exactly the groups
// it had not acknowledged, at once (the killed run's leases are its own).
func TestConsumeRestartResumes(t *testing.T) {
	t.Parallel() // see main_test.go
	bin := e2eBinary(t)
	work := t.TempDir()
	out := filepath.Join(work, "out")
	chunks := consGenChunks(t, bin, work, 4, "--groups", "240", "--seed", "7")
	d := consLocal(t, out, consIngest(t, bin, work, out, chunks))
	all := consAll(d)
	common := []string{"--from", out, "--max-tokens", strconv.Itoa(consMaxTokens), "--poll", "100ms"}

	t.Run("no-ack peeks", func(t *testing.T) {
		// Peeking beyond --max-inflight batches ends (nothing to wait for),
		// settles nothing, and the next peek sees the same groups.
		deadline := time.Now().Add(40 * time.Second)
		args := append([]string{"--consumer-group", "peek", "--no-ack", "--max-batches", "9", "--max-inflight", "2"}, common...)
		var seen []map[string]int
		for run := 0; run < 2; run++ {
			p := consStart(t, bin, t.TempDir(), "p", args...)
			p.wait(t, deadline)
			l := p.lines(t, false)
			if len(l) != 9 {
				t.Fatalf("peek %d printed %d batches, want 9", run, len(l))
			}
			g := map[string]int{}
			consGroupsOf(l, g)
			seen = append(seen, g)
		}
		if len(seen[0]) != len(seen[1]) {
			t.Errorf("two peeks saw %d and %d groups", len(seen[0]), len(seen[1]))
		}
		for g := range seen[0] {
			if seen[1][g] == 0 {
				t.Errorf("group %s seen by the first peek only: a peek settled it", g)
			}
		}
		if p := consLocalProgress(t, out, "peek"); p.GroupsAcked != 0 || p.Leased != 0 {
			t.Errorf("after peeking: %+v, want nothing acknowledged or leased", p)
		}
		if names, _ := os.ReadDir(filepath.Join(out, "_consumers", "peek")); len(names) != 0 {
			t.Errorf("peeking wrote %d objects into the group's log", len(names))
		}
	})

	t.Run("no group peeks", func(t *testing.T) {
		// Without --consumer-group: the same batches, ids included, every
		// run, and nothing in the store.
		deadline := time.Now().Add(40 * time.Second)
		before, _ := os.ReadDir(filepath.Join(out, "_consumers"))
		var outs [][]byte
		for run := 0; run < 2; run++ {
			p := consStart(t, bin, t.TempDir(), "n", append([]string{"--max-batches", "5"}, common...)...)
			p.wait(t, deadline)
			data, err := os.ReadFile(p.out)
			if err != nil {
				t.Fatal(err)
			}
			outs = append(outs, data)
		}
		if !bytes.Equal(outs[0], outs[1]) || bytes.Count(outs[0], []byte("\n")) != 5 {
			t.Errorf("two peeks printed\n%s\nand\n%s", outs[0], outs[1])
		}
		if after, _ := os.ReadDir(filepath.Join(out, "_consumers")); len(after) != len(before) {
			t.Errorf("a peek without a group added to _consumers: %d entries, then %d", len(before), len(after))
		}
	})

	t.Run("max-batches", func(t *testing.T) {
		work := t.TempDir()
		deadline := time.Now().Add(40 * time.Second)
		args := append([]string{"--consumer-group", "r", "--max-batches", "20"}, common...)
		first := consStart(t, bin, work, "t", args...)
		first.wait(t, deadline)
		l1 := first.lines(t, false)
		if len(l1) != 20 {
			t.Fatalf("first run printed %d batches, want 20 (--max-batches)", len(l1))
		}
		consCheckLines(t, "t (first run)", l1, d)
		g1 := map[string]int{}
		n1 := consGroupsOf(l1, g1)
		if len(g1) != n1 {
			t.Errorf("first run printed %d groups, %d distinct", n1, len(g1))
		}
		if st := first.tallies(t); st.GroupsAcked != int64(n1) {
			t.Errorf("first run acknowledged %d groups, printed %d", st.GroupsAcked, n1)
		}
		p := consLocalProgress(t, out, "r")
		if p.GroupsAcked != int64(n1) || p.Leased != 0 || p.Done >= d.shards {
			t.Errorf("after the first run: progress %+v; want %d groups acknowledged, no shard leased (released at exit), not all %d done",
				p, n1, d.shards)
		}

		// The same name, a new output file.
		second := consStart(t, bin, t.TempDir(), "t", append([]string{"--consumer-group", "r"}, common...)...)
		second.wait(t, deadline)
		l2 := second.lines(t, false)
		consCheckLines(t, "t (second run)", l2, d)
		g2 := map[string]int{}
		consGroupsOf(l2, g2)
		both := map[string]int{}
		consGroupsOf(l1, both)
		consGroupsOf(l2, both)
		for g, n := range g2 {
			if n > 1 {
				t.Errorf("second run printed group %s %d times", g, n)
			}
			if g1[g] > 0 {
				t.Errorf("group %s printed by both runs", g)
			}
		}
		consSameSet(t, "printed by the two runs", both, all)
		if st := second.tallies(t); st.GroupsAcked != int64(len(all)-n1) || st.Takeovers != 0 {
			t.Errorf("second run acknowledged %d groups (want %d), took over %d shards (want 0)", st.GroupsAcked, len(all)-n1, st.Takeovers)
		}
		if p := consLocalProgress(t, out, "r"); p.GroupsAcked != int64(len(all)) || p.GroupsSkip != 0 || p.Done != d.shards || p.Shards != d.shards {
			t.Errorf("progress %+v; want %d groups acknowledged, %d shards all done", p, len(all), d.shards)
		}
	})

	t.Run("killed", func(t *testing.T) {
		// A lease far longer than the test: only the same name may take the
		// killed run's shards back before the end.
		args := append([]string{"--consumer-group", "k", "--lease-timeout", "10m"}, common...)
		deadline := time.Now().Add(40 * time.Second)
		first := consStart(t, bin, t.TempDir(), "t", args...)
		first.kill(t, 5, deadline)
		l1 := first.lines(t, true)
		second := consStart(t, bin, t.TempDir(), "t", args...)
		second.wait(t, deadline)
		l2 := second.lines(t, false)
		consCheckLines(t, "t (killed run)", l1, d)
		consCheckLines(t, "t (second run)", l2, d)
		g1, g2, both := map[string]int{}, map[string]int{}, map[string]int{}
		consGroupsOf(l1, g1)
		consGroupsOf(l2, g2)
		consGroupsOf(l1, both)
		consGroupsOf(l2, both)
		consSameSet(t, "printed by the two runs", both, all)
		last := map[string]bool{}
		for _, g := range l1[len(l1)-1].Groups {
			last[g] = true
		}
		again := 0
		for g, n := range both {
			if g1[g] > 1 || g2[g] > 1 || (n > 1 && !last[g]) {
				t.Errorf("group %s printed %d times by the killed run and %d by the second (killed run's last batch: %v)",
					g, g1[g], g2[g], l1[len(l1)-1].Groups)
			}
			if n > 1 {
				again++
			}
		}
		if again != 0 && again != len(last) {
			t.Errorf("%d groups printed again; want none or the %d of the killed run's last batch", again, len(last))
		}
		if p := consLocalProgress(t, out, "k"); p.GroupsAcked != int64(len(all)) || p.GroupsSkip != 0 || p.Done != d.shards {
			t.Errorf("progress %+v; want %d groups acknowledged, %d shards all done", p, len(all), d.shards)
		}
		t.Logf("killed run printed %d batches; %d groups printed again", len(l1), again)
	})
}

// TestConsumeSlowMemberKeepsItsShards: a member whose trainer stops
// reading for several lease timeouts (its output is a pipe the test stops
// draining) keeps renewing its leases: the other member, idle meanwhile,
// takes nothing over, no acknowledgement is refused and no group is
// delivered twice. The slow member prints Arrow IPC, whose rows are
// checked against DuckDB too.
func TestConsumeSlowMemberKeepsItsShards(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	out := filepath.Join(work, "out")
	chunks := consGenChunks(t, bin, work, 4, "--groups", "200", "--seed", "9")
	d := consLocal(t, out, consIngest(t, bin, work, out, chunks))
	all := consAll(d)
	const lease = time.Second
	args := []string{"--from", out, "--consumer-group", "slow", "--max-tokens", strconv.Itoa(consMaxTokens),
		"--lease-timeout", lease.String(), "--poll", "50ms"}
	deadline := time.Now().Add(40 * time.Second)
	slow, stdout := consLaunch(t, bin, work, "slow", true, append([]string{"--format", "arrow", "--to", "-"}, args...)...)
	fast := consStart(t, bin, work, "fast", args...)

	type result struct {
		groups  [][]string
		rows    []int64
		tokens  []int64
		err     error
		stalled time.Duration
	}
	resc := make(chan result, 1)
	go func() {
		var res result
		defer func() { resc <- res }()
		rd, err := ipc.NewReader(stdout)
		if err != nil {
			res.err = err
			return
		}
		defer rd.Release()
		for rd.Next() {
			rec := rd.RecordBatch()
			sc := rec.Schema()
			col := func(name string) arrow.Array {
				idx := sc.FieldIndices(name)
				if len(idx) == 0 {
					return nil
				}
				return rec.Column(idx[0])
			}
			gid, ok1 := col("group_id").(*array.String)
			prompt, ok2 := col("prompt_ids").(*array.List)
			resp, ok3 := col("response_ids").(*array.List)
			if !ok1 || !ok2 || !ok3 {
				res.err = fmt.Errorf("unexpected batch schema %s", sc)
				return
			}
			var groups []string
			var tokens int64
			for i := 0; i < int(rec.NumRows()); i++ {
				if g := gid.Value(i); len(groups) == 0 || groups[len(groups)-1] != g {
					groups = append(groups, g)
				}
				ps, pe := prompt.ValueOffsets(i)
				rs, re := resp.ValueOffsets(i)
				tokens += (pe - ps) + (re - rs)
			}
			res.groups = append(res.groups, groups)
			res.rows = append(res.rows, rec.NumRows())
			res.tokens = append(res.tokens, tokens)
			if len(res.groups) == 3 {
				// The trainer stalls: the member blocks writing its next
				// batches, holding its shards.
				began := time.Now()
				time.Sleep(3 * lease)
				res.stalled = time.Since(began)
			}
		}
		res.err = rd.Err()
	}()
	var res result
	select {
	case res = <-resc:
	case <-time.After(time.Until(deadline)):
		t.Fatal("reading the slow member's output did not finish in time")
	}
	if res.err != nil {
		t.Fatalf("reading the slow member's Arrow stream: %v\n%s", res.err, e2eClip(slow.stderr.String(), 4000))
	}
	slow.wait(t, deadline)
	fast.wait(t, deadline)
	if res.stalled == 0 {
		t.Fatalf("the slow member printed %d batches only: it never stalled", len(res.groups))
	}

	// The Arrow batches, checked like JSON lines (tokens counted from the
	// rows themselves).
	var slowLines []consLine
	for i, g := range res.groups {
		slowLines = append(slowLines, consLine{Groups: g, Rows: res.rows[i], Tokens: res.tokens[i],
			Oversized: len(g) == 1 && res.tokens[i] > consMaxTokens})
	}
	consCheckLines(t, slow.name, slowLines, d)
	fastLines := fast.lines(t, false)
	consCheckLines(t, fast.name, fastLines, d)
	seen := map[string]int{}
	consGroupsOf(slowLines, seen)
	consGroupsOf(fastLines, seen)
	consSameSet(t, "printed by the two members", seen, all)
	for g, n := range seen {
		if n > 1 {
			t.Errorf("group %s printed %d times", g, n)
		}
	}
	for _, p := range []*consProc{slow, fast} {
		st := p.tallies(t)
		if st.GroupsLost != 0 || st.Takeovers != 0 {
			t.Errorf("member %s: %d groups' acknowledgements refused, %d shards taken over; want none", p.name, st.GroupsLost, st.Takeovers)
		}
	}
	if st := slow.tallies(t); st.Batches != int64(len(slowLines)) {
		t.Errorf("the slow member reports %d batches, printed %d", st.Batches, len(slowLines))
	}
	if p := consLocalProgress(t, out, "slow"); p.GroupsAcked != int64(len(all)) || p.GroupsSkip != 0 || p.Done != d.shards || p.Shards != d.shards {
		t.Errorf("progress %+v; want %d groups acknowledged, %d shards all done", p, len(all), d.shards)
	}
	t.Logf("%d groups in %d shards: %d batches from the slow member (stalled %v), %d from the other",
		len(all), d.shards, len(slowLines), res.stalled.Round(time.Millisecond), len(fastLines))
}

// TestConsumeStalenessAndBudget: groups more than --max-staleness versions
// behind --policy-version are skipped (and counted), all others delivered
// within the budget; groups newer than the trainer are not stale.
func TestConsumeStalenessAndBudget(t *testing.T) {
	t.Parallel() // see main_test.go
	bin := e2eBinary(t)
	work := t.TempDir()
	out := filepath.Join(work, "out")
	chunks := consGenChunks(t, bin, work, 2, "--groups", "240", "--policy-versions", "6", "--seed", "5")
	d := consLocal(t, out, consIngest(t, bin, work, out, chunks))
	versions := map[int64]int{}
	for _, g := range d.groups {
		versions[g.version]++
	}
	t.Logf("groups by group_version: %v", versions)
	if len(versions) < 5 {
		t.Fatalf("--policy-versions 6 gave only %d group versions", len(versions))
	}

	for i, c := range []struct{ version, staleness int64 }{{5, 2}, {2, 0}, {5, 4}, {2, -1}} {
		t.Run(fmt.Sprintf("v%d-s%d", c.version, c.staleness), func(t *testing.T) {
			group := fmt.Sprintf("s%d", i)
			fresh, stale := map[string]bool{}, 0
			newer := 0
			for id, g := range d.groups {
				if c.staleness >= 0 && c.version-g.version > c.staleness {
					stale++
				} else {
					fresh[id] = true
				}
				if g.version > c.version {
					newer++
				}
			}
			if c.staleness >= 0 && (stale == 0 || len(fresh) == 0) {
				t.Fatalf("the data does not exercise the bound: %d stale, %d fresh", stale, len(fresh))
			}
			p := consStart(t, bin, t.TempDir(), "m", "--from", out, "--consumer-group", group,
				"--policy-version", strconv.FormatInt(c.version, 10), "--max-staleness", strconv.FormatInt(c.staleness, 10),
				"--max-tokens", strconv.Itoa(consMaxTokens), "--poll", "100ms")
			p.wait(t, time.Now().Add(40*time.Second))
			lines := p.lines(t, false)
			consCheckLines(t, p.name, lines, d)
			got := map[string]int{}
			consGroupsOf(lines, got)
			for g, n := range got {
				if n > 1 {
					t.Errorf("group %s printed %d times", g, n)
				}
			}
			consSameSet(t, "printed", got, fresh)
			if s := consSummary(t, p.name, p.stderr.String()); s.stale != int64(stale) || s.acked != int64(len(fresh)) || s.empty != 0 {
				t.Errorf("summary: %d stale, %d acknowledged, %d empty; want %d stale, %d acknowledged, 0 empty",
					s.stale, s.acked, s.empty, stale, len(fresh))
			}
			p.tallies(t)
			if pr := consLocalProgress(t, out, group); pr.GroupsAcked != int64(len(fresh)) || pr.GroupsSkip != int64(stale) ||
				pr.Done != d.shards || pr.Shards != d.shards {
				t.Errorf("progress %+v; want %d acknowledged, %d skipped, %d shards all done", pr, len(fresh), stale, d.shards)
			}
			t.Logf("%d fresh (%d newer than the trainer), %d stale, %d batches", len(fresh), newer, stale, len(lines))
		})
	}
}

// TestIntegrationConsumeS3KillOneMember is TestConsumeGroupKillOneMember
// over MinIO: shards and the group's log in s3://.
func TestIntegrationConsumeS3KillOneMember(t *testing.T) {
	// Not parallel: its members renew 2 s leases (see main_test.go).
	target := newS3Target(t, "consume")
	bin := e2eBinary(t)
	work := t.TempDir()
	to, ep := target.url, target.flags()
	chunks := consGenChunks(t, bin, work, 8, "--groups", "400", "--seed", "3")
	written := consIngest(t, bin, work, to, chunks, append([]string{"--shard-size", "256KiB"}, ep...)...)

	ctx := context.Background()
	st := target.open(t, "consume-test")
	cli, bucket := st.Client()
	var (
		entries []schemas.ShardEntry
		paths   []string
	)
	for _, e := range mustEntries(t, st) {
		if e.Path == "" {
			continue
		}
		p := filepath.Join(work, "shards", filepath.FromSlash(e.Path))
		if err := cli.FGetObject(ctx, bucket, st.Key(e.Path), p, minio.GetObjectOptions{}); err != nil {
			t.Fatal(err)
		}
		entries = append(entries, e)
		paths = append(paths, p)
	}
	d := consCommitted(t, entries, paths, written)
	if d.shards < 12 {
		t.Fatalf("only %d shards: the members would not share much", d.shards)
	}
	consKillOneMember(t, bin, work, to, ep, d, func() train.Progress {
		obj, err := st.Objects(train.GroupDir("g"))
		if err != nil {
			t.Fatal(err)
		}
		p, err := train.GroupProgress(ctx, obj)
		if err != nil {
			t.Fatal(err)
		}
		return p
	})
}

// TestOutputFlagsRefusedInStore: no file-writing flag of any command may
// write into a store's reserved folders, its root or a shard, whether the
// store is the one the command reads or writes or another one, through a
// relative path or a link: each is a usage error naming the flag (exit 2)
// and the manifest is left as it was.
func TestOutputFlagsRefusedInStore(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(in, append(bytes.Join(stopRecords(4), []byte("\n")), '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	st := filepath.Join(dir, "st")
	if code := run(context.Background(), []string{"ingest", "--from", in, "--to", st, "--quiet"}, io.Discard, io.Discard); code != 0 {
		t.Fatalf("ingest: exit %d", code)
	}
	manifest := filepath.Join(st, "_manifest", "shards.jsonl")
	before, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(st, "_manifest"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other")
	for _, c := range []struct {
		flag string
		args []string
	}{
		{"stats-json", []string{"ingest", "--from", in, "--to", other, "--stats-json", manifest}},
		{"stats-json", []string{"ingest", "--from", in, "--to", st, "--stats-json", filepath.Join(st, "_manifest", "stats.json")}},
		{"cpuprofile", []string{"ingest", "--from", in, "--to", other, "--cpuprofile", manifest}},
		{"dlq", []string{"ingest", "--from", in, "--to", other, "--dlq", manifest}},
		{"to", []string{"consume", "--from", st, "--to", manifest}},
		{"to", []string{"consume", "--from", st, "--to", filepath.Join(dir, "link", "shards.jsonl")}},
		{"to", []string{"consume", "--from", st, "--to", st}},
		{"stats-json", []string{"consume", "--from", st, "--stats-json", manifest}},
		{"cpuprofile", []string{"consume", "--from", other, "--cpuprofile", manifest}},
		{"ready-file", []string{"serve", "--from", st, "--listen", "127.0.0.1:0", "--ready-file", manifest}},
		{"download-dir", []string{"sql", "--from", st, "--download-dir", filepath.Join(st, "_manifest"), "SELECT 1"}},
		{"to", []string{"report", "--from", st, "--to", manifest}},
		{"to", []string{"report", "--from", other, "--to", filepath.Join(dir, "link", "shards.jsonl")}},
		{"download-dir", []string{"report", "--from", st, "--download-dir", filepath.Join(st, "_dlq"), "--to", filepath.Join(dir, "r.html")}},
	} {
		var stderr bytes.Buffer
		code := run(context.Background(), c.args, io.Discard, &stderr)
		if code != exitUsage || !strings.Contains(stderr.String(), "--"+c.flag) {
			t.Errorf("%v: exit %d, want %d naming --%s; stderr: %s", c.args, code, exitUsage, c.flag, e2eClip(stderr.String(), 300))
		}
		if after, _ := os.ReadFile(manifest); !bytes.Equal(after, before) {
			t.Fatalf("%v changed the manifest", c.args)
		}
	}
	// Outputs beside the store, or in its root but outside the reserved
	// folders, are fine.
	if code := run(context.Background(), []string{"consume", "--from", st, "--to", filepath.Join(dir, "batches.jsonl"), "--stats-json", filepath.Join(st, "stats.json")}, io.Discard, io.Discard); code != 0 {
		t.Fatalf("consume to a file beside the store: exit %d", code)
	}
}
