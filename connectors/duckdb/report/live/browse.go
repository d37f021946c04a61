package live

import (
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"html/template"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb"
	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb/report"
)

// maxTokensShown bounds the tokens drawn per step.
const maxTokensShown = 8192

// indexTable is the trajectory index the browser pages through: the
// columns it shows and filters on, one row per trajectory, sorted by the
// paging key. Refresh builds it once per reopening (a table in memory,
// made through DB.SQL as the sandbox's Query runs queries only), so a
// click reads it instead of folding every step of the trajectories view
// again.
const indexTable = "ui_trajectories"

// indexSQL builds the index in three statements: the trajectories view
// folds every stored step, so it is read once into indexBase, and the
// group staleness, shard seq, estimator and advantage bin the chart
// buckets link by are computed over that copy with the reports' own
// queries (duckdb.GroupStalenessOver, duckdb.AdvantageBinsOver), so a
// bucket's link finds exactly the rows it counts.
var indexSQL = []string{
	`CREATE TABLE ` + indexBase + ` AS
SELECT group_id, group_version, trajectory_id, task_id, role, reward, advantage, steps, response_tokens, filter_reason, pass, shard, estimator
FROM trajectories`,
	`CREATE TABLE ` + indexTable + ` AS
WITH staleness AS (
` + duckdb.GroupStalenessOver(`(SELECT group_id, group_version, any_value(shard) AS shard FROM `+indexBase+` GROUP BY group_id, group_version)`) + `
), bins AS (
` + duckdb.AdvantageBinsOver(indexBase) + `
)
SELECT t.group_id, t.group_version, t.trajectory_id, t.task_id, coalesce(t.role, '') AS role, t.reward, t.advantage, t.steps,
  t.response_tokens, coalesce(t.filter_reason, '') AS filter_reason, t.pass, st.staleness, s.seq AS shard_seq,
  coalesce(t.estimator, '') AS estimator, b.bin AS adv_bin
FROM ` + indexBase + ` t
LEFT JOIN staleness st ON st.group_id = t.group_id AND st.group_version = t.group_version
LEFT JOIN shards s ON s.path = t.shard
LEFT JOIN bins b ON b.group_id = t.group_id AND b.group_version = t.group_version AND b.trajectory_id = t.trajectory_id
ORDER BY t.group_version, t.group_id, t.trajectory_id`,
	`DROP TABLE ` + indexBase,
}

// indexBase is the trajectories read once while the index is built.
const indexBase = "ui_trajectories_base"

// pageSQL is one page of the index matching the filters (an empty filter
// matches all; a reason matches a trajectory marked by that filter among
// others, as the filtered reports count it, and "(kept)" one no filter
// marked), by keyset: the rows after (or, for a previous page, before)
// the key (group_version, group_id, trajectory_id) of the last row shown,
// never an OFFSET, so a page deep in the run costs what the first one
// does. cmp is ">" with ASC or "<" with DESC.
func pageSQL(cmp, dir string) string {
	return `SELECT group_id, group_version, trajectory_id, task_id, role, reward, advantage, steps, response_tokens, filter_reason, pass,
  staleness, shard_seq AS shard
FROM ` + indexTable + `
WHERE ($1 = '' OR task_id = $1) AND ($2::BIGINT IS NULL OR group_version = $2::BIGINT) AND ($3 = '' OR role = $3)
  AND ($4 = '' OR list_contains(string_split(filter_reason, ','), $4) OR ($4 = '(kept)' AND filter_reason = ''))
  AND ($5::DOUBLE IS NULL OR reward >= $5::DOUBLE) AND ($6::DOUBLE IS NULL OR reward <= $6::DOUBLE)
  AND ($11::BIGINT IS NULL OR staleness = $11::BIGINT) AND ($12::BIGINT IS NULL OR shard_seq = $12::BIGINT)
  AND ($13 = '' OR estimator = $13) AND ($14::BIGINT IS NULL OR adv_bin = $14::BIGINT)
  AND ($7::BIGINT IS NULL OR group_version ` + cmp + ` $7::BIGINT OR (group_version = $7::BIGINT AND (group_id ` + cmp + ` $8 OR (group_id = $8 AND trajectory_id ` + cmp + ` $9))))
ORDER BY group_version ` + dir + `, group_id ` + dir + `, trajectory_id ` + dir + `
LIMIT $10`
}

var (
	nextPageSQL = pageSQL(">", "ASC")
	prevPageSQL = pageSQL("<", "DESC")
)

// stepsSQL is a trajectory's steps (those of the first shard holding
// it, as the trajectories view counts them) with where each step's prompt
// forked from the one before (duckdb.PromptForksOver: fork_at, the
// previous prompt + response's length, and the prompt's tokens around
// the fork, from fork_from).
var stepsSQL = `WITH s AS (
  SELECT * FROM steps
  WHERE group_id = $1 AND group_version = $2 AND trajectory_id = $3
    AND shard = (SELECT min(shard) FROM stored_steps WHERE group_id = $1 AND group_version = $2 AND trajectory_id = $3)
), f AS (
` + duckdb.PromptForksOver("s") + `
)
SELECT s.step_index, s.step_id, s.policy_version, s.messages, s.response_ids, s.response_logprobs, s.teacher_logprobs, s.token_advantages,
  s.reward, s.step_reward, s.advantage, s.finish_reason, s.token_versions, f.fork_at, f.prev_tokens,
  greatest(f.fork_at - ` + forkContext + `, 0) AS fork_from, s.prompt_ids[greatest(f.fork_at - ` + forkContext + `, 0) + 1 : f.fork_at + ` + forkContext + `] AS fork_window
FROM s LEFT JOIN f ON f.step_id = s.step_id
ORDER BY s.step_index
LIMIT 10000`

// forkContext is how many prompt tokens the trajectory page shows on
// each side of a fork.
const forkContext = "4"

func optNum(s string) (any, error) {
	if s == "" {
		return nil, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, fmt.Errorf("%q is not a number", s)
	}
	return f, nil
}

// key is a row's place in the paging order.
type key struct {
	version int64
	group   string
	traj    string
}

// readKey reads the key named by prefix (after_ or before_) from q; ok is
// false when there is none.
func readKey(q url.Values, prefix string) (key, bool, error) {
	v := q.Get(prefix + "v")
	if v == "" {
		return key{}, false, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return key{}, false, fmt.Errorf("%sv: not an integer", prefix)
	}
	return key{n, q.Get(prefix + "g"), q.Get(prefix + "t")}, true, nil
}

func (k key) set(q url.Values, prefix string) {
	q.Set(prefix+"v", strconv.FormatInt(k.version, 10))
	q.Set(prefix+"g", k.group)
	q.Set(prefix+"t", k.traj)
}

func rowKey(row []any) key {
	v, _ := row[1].(int64)
	return key{v, report.Str(row[0]), report.Str(row[2])}
}

// filterKeys are the browser's filters: query parameter and label.
var filterKeys = [][2]string{{"task", "task"}, {"version", "policy version"}, {"role", "role"}, {"reason", "filter reason"}, {"min_reward", "reward ≥"}, {"max_reward", "reward ≤"},
	{"staleness", "staleness"}, {"shard", "shard seq"}, {"estimator", "estimator"}, {"adv_bin", "advantage bin"}}

// optInt reads an integer filter ("" for none).
func optInt(name, s string) (any, error) {
	if s == "" {
		return nil, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("%s: not an integer", name)
	}
	return n, nil
}

func (s *Server) trajectories(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := func(k string) string { return strings.TrimSpace(q.Get(k)) }
	page, _ := strconv.Atoi(q.Get("page"))
	page = max(page, 0)
	ints := map[string]any{}
	for _, k := range []string{"version", "staleness", "shard", "adv_bin"} {
		n, err := optInt(k, f(k))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ints[k] = n
	}
	lo, err1 := optNum(f("min_reward"))
	hi, err2 := optNum(f("max_reward"))
	if err1 != nil || err2 != nil {
		http.Error(w, "reward bounds: not numbers", http.StatusBadRequest)
		return
	}
	after, hasAfter, err1 := readKey(q, "after_")
	before, hasBefore, err2 := readKey(q, "before_")
	if err := errors.Join(err1, err2); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.db == nil {
		http.Error(w, "not ready", http.StatusServiceUnavailable)
		return
	}
	n := s.o.PageSize
	text, at := nextPageSQL, after
	if hasBefore {
		text, at = prevPageSQL, before
	}
	var kv, kg, kt any
	if hasAfter || hasBefore {
		kv, kg, kt = at.version, at.group, at.traj
	}
	t, err := report.RunTable(r.Context(), s.db, "trajectories", text,
		f("task"), ints["version"], f("role"), f("reason"), lo, hi, kv, kg, kt, n+1, ints["staleness"], ints["shard"], f("estimator"), ints["adv_bin"])
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	more := len(t.Rows) > n
	if more {
		t.Rows = t.Rows[:n]
	}
	// Going back, the rows came newest first, and "more" means there is
	// a page before; there is always one after (the page we came from).
	hasPrev, hasNext := hasAfter, more
	if hasBefore {
		slices.Reverse(t.Rows)
		hasPrev, hasNext = more, true
	}
	var b strings.Builder
	b.WriteString(`<p class="meta"><a href="/">charts</a></p><form id="filters" method="get" action="/trajectories">`)
	for _, k := range filterKeys {
		if (k[0] == "estimator" || k[0] == "adv_bin") && f(k[0]) == "" {
			continue // set by the advantage histogram's links only
		}
		fmt.Fprintf(&b, `<label>%s <input name="%s" value="%s" size="10"></label> `, k[1], k[0], html.EscapeString(f(k[0])))
	}
	b.WriteString(`<button type="submit">filter</button></form>`)
	fmt.Fprintf(&b, `<table id="trajectories" data-page="%d" data-rows="%d"><tr>`, page, len(t.Rows))
	for _, c := range t.Columns {
		fmt.Fprintf(&b, `<th>%s</th>`, report.Esc(c))
	}
	b.WriteString(`</tr>`)
	for _, row := range t.Rows {
		v := url.Values{"g": {report.Str(row[0])}, "v": {report.FormatCell(row[1])}, "t": {report.Str(row[2])}}
		b.WriteString(`<tr class="traj">`)
		for i, c := range row {
			cell := report.Esc(report.FormatCell(c))
			if i == 2 {
				cell = `<a href="/trajectory?` + html.EscapeString(v.Encode()) + `">` + cell + `</a>`
			}
			fmt.Fprintf(&b, `<td>%s</td>`, cell)
		}
		b.WriteString(`</tr>`)
	}
	b.WriteString(`</table><p class="pager">`)
	nav := func(p int, k key, prefix, label, id string) {
		qq := url.Values{}
		for _, fk := range filterKeys {
			if v := f(fk[0]); v != "" {
				qq.Set(fk[0], v)
			}
		}
		qq.Set("page", strconv.Itoa(p))
		k.set(qq, prefix)
		fmt.Fprintf(&b, `<a id="%s" href="/trajectories?%s">%s</a> `, id, html.EscapeString(qq.Encode()), label)
	}
	if hasPrev && len(t.Rows) > 0 {
		nav(max(page-1, 0), rowKey(t.Rows[0]), "before_", "← previous", "prev")
	}
	fmt.Fprintf(&b, `page %d `, page+1)
	if hasNext && len(t.Rows) > 0 {
		nav(page+1, rowKey(t.Rows[len(t.Rows)-1]), "after_", "next →", "next")
	}
	b.WriteString(`</p>`)
	render(w, "trajectories", 0, template.HTML(b.String()))
}

type message struct {
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	ToolCalls []struct {
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
	Name string `json:"name"`
}

func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) == nil {
		var out []string
		for _, p := range parts {
			out = append(out, p.Text)
		}
		return strings.Join(out, "\n")
	}
	return string(raw)
}

// ints is a list of integers (nil for NULL).
func ints(v any) []int64 {
	l, _ := v.([]any)
	out := make([]int64, 0, len(l))
	for _, x := range l {
		f, _ := report.Num(normaliseAny(x))
		out = append(out, int64(f))
	}
	return out
}

// versionRuns writes per-token versions as their runs: "v5 ×2, v6 ×3".
func versionRuns(vs []int64) string {
	var parts []string
	for i := 0; i < len(vs); {
		j := i
		for j < len(vs) && vs[j] == vs[i] {
			j++
		}
		parts = append(parts, fmt.Sprintf("v%d ×%d", vs[i], j-i))
		i = j
	}
	return strings.Join(parts, ", ")
}

func floats(v any) []float64 {
	l, _ := v.([]any)
	out := make([]float64, 0, len(l))
	for _, x := range l {
		f, _ := report.Num(normaliseAny(x))
		out = append(out, f)
	}
	return out
}

func normaliseAny(x any) any {
	switch v := x.(type) {
	case float32:
		return float64(v)
	case int32:
		return int64(v)
	}
	return x
}

// colourMode is one way of colouring a trajectory's response tokens:
// the query value (colour=NAME), its label, and the legend of its
// classes.
type colourMode struct {
	name, label string
	legend      [][2]string // class, meaning
	class       func(float64) string
}

// colourModes: logprob (the default), teacher logprob and token advantage.
var colourModes = []colourMode{
	{"logprob", "logprob", [][2]string{{"lp0", "> -0.1"}, {"lp1", "-1 to -0.1"}, {"lp2", "-3 to -1"}, {"lp3", "≤ -3"}}, func(v float64) string { return logprobClass("lp", v) }},
	{"teacher", "teacher logprob", [][2]string{{"tp0", "> -0.1"}, {"tp1", "-1 to -0.1"}, {"tp2", "-3 to -1"}, {"tp3", "≤ -3"}}, func(v float64) string { return logprobClass("tp", v) }},
	{"advantage", "token advantage", [][2]string{{"adn2", "≤ -1"}, {"adn1", "-1 to -0.1"}, {"ad0", "-0.1 to 0.1"}, {"adp1", "0.1 to 1"}, {"adp2", "≥ 1"}}, advantageClass},
}

// logprobClass buckets a logprob: sure (no colour) to unsure; "na"
// when there is none.
func logprobClass(prefix string, lp float64) string {
	switch {
	case math.IsNaN(lp):
		return "na"
	case lp > -0.1:
		return prefix + "0"
	case lp > -1:
		return prefix + "1"
	case lp > -3:
		return prefix + "2"
	}
	return prefix + "3"
}

// advantageClass buckets an advantage: red below 0, green above.
func advantageClass(a float64) string {
	switch {
	case math.IsNaN(a):
		return "na"
	case a <= -1:
		return "adn2"
	case a < -0.1:
		return "adn1"
	case a <= 0.1:
		return "ad0"
	case a < 1:
		return "adp1"
	}
	return "adp2"
}

// at is v[i], or NaN past its end.
func at(v []float64, i int) float64 {
	if i < len(v) {
		return v[i]
	}
	return math.NaN()
}

func (s *Server) trajectory(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	gv, err := strconv.ParseInt(q.Get("v"), 10, 64)
	if err != nil || q.Get("g") == "" || q.Get("t") == "" {
		http.Error(w, "want g, v and t", http.StatusBadRequest)
		return
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.db == nil {
		http.Error(w, "not ready", http.StatusServiceUnavailable)
		return
	}
	t, err := report.RunTable(r.Context(), s.db, "steps", stepsSQL, q.Get("g"), gv, q.Get("t"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	// The colourings this trajectory has: logprob always, teacher
	// logprob when a step has them, advantage when a step has one (its
	// token advantages where present, else the step's advantage for
	// every token).
	hasTeacher, hasAdv := false, false
	for _, row := range t.Rows {
		hasTeacher = hasTeacher || len(floats(row[6])) > 0
		_, ok := report.Num(row[10])
		hasAdv = hasAdv || ok || len(floats(row[7])) > 0
	}
	mode := colourModes[0]
	var modes []colourMode
	for _, m := range colourModes {
		if m.name == "teacher" && !hasTeacher || m.name == "advantage" && !hasAdv {
			continue
		}
		modes = append(modes, m)
		if m.name == q.Get("colour") {
			mode = m
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<p class="meta"><a href="/trajectories">trajectories</a> · group %s v%d · trajectory %s · %d steps</p>`,
		report.Esc(q.Get("g")), gv, report.Esc(q.Get("t")), len(t.Rows))
	b.WriteString(`<p class="meta" id="colour-modes">colour tokens by: `)
	for _, m := range modes {
		v := url.Values{"g": {q.Get("g")}, "v": {q.Get("v")}, "t": {q.Get("t")}, "colour": {m.name}}
		on := ""
		if m.name == mode.name {
			on = ` class="on" aria-current="true"`
		}
		fmt.Fprintf(&b, `<a href="/trajectory?%s" data-mode="%s"%s>%s</a> `, html.EscapeString(v.Encode()), m.name, on, m.label)
	}
	fmt.Fprintf(&b, `</p><p class="meta legend" id="legend" data-mode="%s">%s: `, mode.name, mode.label)
	for _, l := range mode.legend {
		fmt.Fprintf(&b, `<span class="tok %s">%s</span> `, l[0], report.Esc(l[1]))
	}
	switch mode.name {
	case "teacher":
		b.WriteString(`<span class="tok na">none</span> (steps without teacher logprobs)`)
	case "advantage":
		b.WriteString(`(token advantages where the step has them, else the step's advantage on every token)`)
	}
	b.WriteString(`</p>`)
	for _, row := range t.Rows {
		fmt.Fprintf(&b, `<section class="step" data-step="%s"><h3>step %s · policy v%s · reward <span class="reward">%s</span> · advantage <span class="advantage">%s</span> · finish %s</h3>`,
			report.Esc(report.FormatCell(row[0])), report.Esc(report.FormatCell(row[0])), report.Esc(report.FormatCell(row[2])),
			report.Esc(report.FormatCell(row[8])), report.Esc(report.FormatCell(row[10])), report.Esc(report.FormatCell(row[11])))
		versions := ints(row[12])
		if len(versions) > 0 {
			fmt.Fprintf(&b, ` · <span class="versions">tokens from policy %s</span>`, report.Esc(versionRuns(versions)))
		}
		if forkAt, ok := report.Num(row[13]); ok {
			prev, _ := report.Num(row[14])
			from, _ := report.Num(row[15])
			fmt.Fprintf(&b, `<div class="prompt-fork" data-fork-at="%d" data-prev-tokens="%d">prompt forked at token %d: it does not extend the previous step's prompt + response (%d tokens); prompt from token %d: `,
				int64(forkAt), int64(prev), int64(forkAt), int64(prev), int64(from))
			for i, id := range ints(row[16]) {
				cls := "tok"
				if int64(from)+int64(i) == int64(forkAt) {
					cls = "tok forked"
				}
				fmt.Fprintf(&b, `<span class="%s" title="prompt token %d">%d</span>`, cls, int64(from)+int64(i), id)
			}
			b.WriteString(`</div>`)
		}
		var msgs []message
		if m := report.Str(row[3]); m != "" && json.Unmarshal([]byte(m), &msgs) == nil {
			for _, m := range msgs {
				fmt.Fprintf(&b, `<div class="msg %s"><b>%s</b>`, report.Esc(m.Role), report.Esc(m.Role))
				if txt := contentText(m.Content); txt != "" && txt != "null" {
					fmt.Fprintf(&b, "<pre>\n%s</pre>", report.Esc(txt)) // the parser drops a newline right after <pre>: this one, not the text's
				}
				for _, tc := range m.ToolCalls {
					fmt.Fprintf(&b, `<div class="toolcall">tool call <code>%s(%s)</code></div>`, report.Esc(tc.Function.Name), report.Esc(tc.Function.Arguments))
				}
				b.WriteString(`</div>`)
			}
		}
		ids, _ := row[4].([]any)
		lps := floats(row[5])
		teacher := floats(row[6])
		tadv := floats(row[7])
		advSource := "token"
		if len(tadv) == 0 {
			advSource = "step"
			if a, ok := report.Num(row[10]); ok {
				tadv = make([]float64, len(ids))
				for i := range tadv {
					tadv[i] = a
				}
			}
		}
		fmt.Fprintf(&b, `<div class="tokens" data-adv-source="%s">`, advSource)
		for i, id := range ids {
			if i >= maxTokensShown {
				fmt.Fprintf(&b, ` … %d more`, len(ids)-i)
				break
			}
			lp, tl, ta := at(lps, i), at(teacher, i), at(tadv, i)
			title := fmt.Sprintf("token %v logprob %.4g", id, lp)
			if i < len(teacher) {
				title += fmt.Sprintf(" teacher %.4g", tl)
			}
			if !math.IsNaN(ta) {
				title += fmt.Sprintf(" advantage %.4g", ta)
			}
			v := lp
			switch mode.name {
			case "teacher":
				v = tl
			case "advantage":
				v = ta
			}
			vattr := ""
			if i < len(versions) {
				title += fmt.Sprintf(" policy v%d", versions[i])
				vattr = fmt.Sprintf(` data-v="%d"`, versions[i])
				if i > 0 && versions[i] != versions[i-1] {
					vattr += ` data-vchange=""`
				}
			}
			fmt.Fprintf(&b, `<span class="tok %s" title="%s"%s>%v</span>`, mode.class(v), title, vattr, id)
		}
		b.WriteString(`</div></section>`)
	}
	render(w, "trajectory", 0, template.HTML(b.String()))
}

var shell = template.Must(template.New("ui").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<meta name="color-scheme" content="light dark"><title>{{.Title}}</title><style>{{.CSS}}</style></head>
<body data-generation="{{.Gen}}"><h1>{{.Title}}</h1>{{.Body}}<script src="/app.js"></script></body></html>
`))

const uiCSS = `.tok{font:12px ui-monospace,monospace;padding:0 2px;margin:1px;display:inline-block;border-radius:3px}
.lp1{background:rgba(255,200,0,.25)} .lp2{background:rgba(255,120,0,.45)} .lp3{background:rgba(230,0,40,.55)}
.tp1{background:rgba(60,140,255,.22)} .tp2{background:rgba(60,110,255,.42)} .tp3{background:rgba(110,60,255,.6)}
.adn2{background:rgba(230,0,40,.55)} .adn1{background:rgba(230,0,40,.22)} .adp1{background:rgba(30,170,70,.25)} .adp2{background:rgba(30,170,70,.55)}
.tok.na{outline:1px dashed var(--grid)} #colour-modes a{padding:1px 6px;border-radius:4px} #colour-modes a.on{background:var(--card);font-weight:600;text-decoration:none}
.msg{border-left:3px solid var(--grid);padding:2px 8px;margin:6px 0} .msg pre{white-space:pre-wrap;margin:2px 0}
.toolcall{color:var(--c3)} .step{background:var(--card);border-radius:8px;padding:8px 12px;margin:12px 0}
.tok[data-vchange]{border-left:3px solid var(--c1)} .prompt-fork{font-size:12px;margin:4px 0} .tok.forked{outline:2px solid var(--c1)}
#health{font-variant-numeric:tabular-nums} .err{color:var(--c1)} form label{margin-right:8px}`

func render(w http.ResponseWriter, title string, gen int, body template.HTML) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	shell.Execute(w, map[string]any{"Title": title, "Gen": gen, "CSS": template.CSS(report.CSS + uiCSS), "Body": body})
}

// appJS polls /api/state: it fills the health panel (and the ingest
// charts, when the ingest metrics are scraped) and, when the generation
// changes (a shard committed), reloads the charts.
const appJS = `(function(){
const health=document.getElementById('health'), charts=document.getElementById('charts');
if(!health) return;
let gen=document.body.dataset.generation;
function esc(s){return String(s).replace(/[&<>"]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c])).replace(/[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]/g,c=>'\\u'+c.charCodeAt(0).toString(16).padStart(4,'0'));}
async function tick(){
  try{
    const st=await (await fetch('/api/state')).json();
    let h='<p>'+st.shards+' shards · '+st.rows+' rows · '+st.groups+' groups · newest policy v'+st.newest_policy_version+
      ' · '+st.commits_per_minute.toFixed(1)+' commits/min (last 10 min)</p>';
    if(st.pending_entries>0){h+='<p class="meta" id="pending">'+st.pending_entries+' manifest entries committed since the charts were drawn; they refresh in about '+
      Math.ceil(st.rebuild_in_seconds)+' s (at most every '+st.rebuild_factor+'× the last rebuild, '+st.rebuild_seconds.toFixed(1)+' s)</p>';}
    if(st.consumers.length){h+='<table id="consumers"><tr><th>consumer group</th><th>acknowledged</th><th>skipped</th><th>lag (groups)</th><th>skipped as stale (newest versions)</th><th>members (shards held · policy at last ack · staleness · skipped stale)</th></tr>';
      for(const c of st.consumers){h+='<tr><td>'+esc(c.group)+'</td><td>'+c.groups_acked+'</td><td>'+c.groups_skipped+'</td><td>'+c.lag_groups+'</td><td>'+c.groups_skipped_stale+
        ((c.skipped_stale_by_version||[]).length?' ('+c.skipped_stale_by_version.slice(-8).map(x=>'v'+x.version+': '+x.groups).join(', ')+')':'')+'</td><td>'+
        (c.members||[]).map(m=>esc(m.name)+' ('+m.shards_leased+' · v'+m.policy_version+' · '+m.staleness+' · '+m.groups_skipped_stale+')').join(', ')+'</td></tr>';}
      h+='</table>';} else {h+='<p class="meta">no consumer group yet</p>';}
    health.innerHTML=h;
    const ing=document.getElementById('ingest');
    if(ing&&st.ingest){const r=await fetch('/ingest'); if(r.ok) ing.innerHTML=await r.text();}
    if(String(st.generation)!==String(gen)){
      const r=await fetch('/charts');
      if(r.ok){charts.innerHTML=await r.text(); gen=r.headers.get('X-Generation'); document.body.dataset.generation=gen;}
    }
  }catch(e){health.textContent='not reachable';}
}
tick(); setInterval(tick,1000);
})();`
