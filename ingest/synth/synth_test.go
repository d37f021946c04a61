package synth

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/klauspost/compress/zstd"
)

type toolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type message struct {
	Role       string     `json:"role"`
	Content    string     `json:"content"`
	ToolCalls  []toolCall `json:"tool_calls"`
	ToolCallID string     `json:"tool_call_id"`
}

// record is the union of the step and trajectory wire records; decoding
// with DisallowUnknownFields catches misspelt keys.
type record struct {
	Type              string             `json:"type"`
	StepID            *string            `json:"step_id"`
	TaskID            *string            `json:"task_id"`
	GroupID           *string            `json:"group_id"`
	Role              *string            `json:"role"`
	TrajectoryID      *string            `json:"trajectory_id"`
	StepIndex         *int64             `json:"step_index"`
	PolicyVersion     *int64             `json:"policy_version"`
	PromptIDs         []int64            `json:"prompt_ids"`
	ResponseIDs       []int64            `json:"response_ids"`
	ResponseLogprobs  []float64          `json:"response_logprobs"`
	TokenVersions     []int64            `json:"token_versions"`
	TeacherLogprobs   []float64          `json:"teacher_logprobs"`
	Messages          []message          `json:"messages"`
	Reward            *float64           `json:"reward"`
	Done              *bool              `json:"done"`
	FinishReason      *string            `json:"finish_reason"`
	Model             *string            `json:"model"`
	CreatedAt         *string            `json:"created_at"`
	Metadata          map[string]any     `json:"metadata"`
	NumSteps          *int64             `json:"num_steps"`
	TerminationReason *string            `json:"termination_reason"`
	Signals           map[string]float64 `json:"signals"`
	IsCorrect         *bool              `json:"is_correct"`
	GroupSize         *int64             `json:"group_size"`
}

func (r *record) groupKey() string {
	if r.GroupID != nil {
		return *r.GroupID
	}
	if r.Role != nil {
		return *r.TaskID + ":" + *r.Role
	}
	return *r.TaskID
}

type trajInfo struct {
	rec   *record
	steps map[int64]*record
	key   string
}

// checked is what checkOutput learnt about one generated dataset.
type checked struct {
	lines, dupLines     int
	steps, trajectories int
	groups              map[string][]string // group key -> trajectory ids
	trajs               map[string]*trajInfo
	order               []*record // unique records in output order
	withGroupID         int
	nonASCII            int
}

func generate(t testing.TB, cfg Config) ([]byte, Summary) {
	t.Helper()
	var buf bytes.Buffer
	sum, err := Generate(context.Background(), &buf, cfg)
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	return buf.Bytes(), sum
}

// checkOutput decodes every line and checks the wire-format invariants.
func checkOutput(t *testing.T, out []byte, sum Summary, cfg Config) *checked {
	t.Helper()
	cfg = cfg.withDefaults()
	c := &checked{groups: map[string][]string{}, trajs: map[string]*trajInfo{}}
	if len(out) == 0 || out[len(out)-1] != '\n' {
		t.Fatalf("output does not end with a newline")
	}
	seen := map[string]bool{}
	stepIDs := map[string]bool{}
	finishes := map[string]bool{"stop": true, "length": true, "tool_calls": true, "abort": true}
	terms := map[string]bool{"ENV_DONE": true, "MAX_TURNS_EXCEEDED": true, "TIMEOUT": true, "ERROR": true}
	traj := func(id string) *trajInfo {
		ti := c.trajs[id]
		if ti == nil {
			ti = &trajInfo{steps: map[int64]*record{}}
			c.trajs[id] = ti
		}
		return ti
	}
	for line := range bytes.Lines(out) {
		c.lines++
		if seen[string(line)] {
			c.dupLines++
			continue
		}
		seen[string(line)] = true
		if !utf8.Valid(line) {
			t.Fatalf("line %d: invalid UTF-8", c.lines)
		}
		if !isASCII(line) {
			c.nonASCII++
		}
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		r := new(record)
		if err := dec.Decode(r); err != nil {
			t.Fatalf("line %d: %v\n%.300s", c.lines, err, line)
		}
		if dec.More() {
			t.Fatalf("line %d: trailing data", c.lines)
		}
		if r.TaskID == nil || r.TrajectoryID == nil || *r.TaskID == "" || *r.TrajectoryID == "" {
			t.Fatalf("line %d: missing task_id/trajectory_id", c.lines)
		}
		if r.GroupID != nil {
			c.withGroupID++
		}
		if (r.Role != nil) != (len(cfg.Roles) > 0) {
			t.Fatalf("line %d: role presence %v with Roles %v", c.lines, r.Role != nil, cfg.Roles)
		}
		if r.Role != nil && !slices.Contains(cfg.Roles, *r.Role) {
			t.Fatalf("line %d: unknown role %q", c.lines, *r.Role)
		}
		// An explicit group_id must agree with the default key.
		def := *r.TaskID
		if r.Role != nil {
			def += ":" + *r.Role
		}
		if r.groupKey() != def {
			t.Fatalf("line %d: group_id %q, want %q", c.lines, r.groupKey(), def)
		}
		c.order = append(c.order, r)
		ti := traj(*r.TrajectoryID)
		if ti.key != "" && ti.key != r.groupKey() {
			t.Fatalf("line %d: trajectory %s in two groups", c.lines, *r.TrajectoryID)
		}
		ti.key = r.groupKey()

		switch r.Type {
		case "step":
			c.steps++
			checkStep(t, c.lines, r, cfg, finishes)
			if stepIDs[*r.StepID] {
				t.Fatalf("line %d: duplicate step_id %s", c.lines, *r.StepID)
			}
			stepIDs[*r.StepID] = true
			if ti.steps[*r.StepIndex] != nil {
				t.Fatalf("line %d: step %d of %s twice", c.lines, *r.StepIndex, *r.TrajectoryID)
			}
			ti.steps[*r.StepIndex] = r
		case "trajectory":
			c.trajectories++
			if ti.rec != nil {
				t.Fatalf("line %d: trajectory %s twice", c.lines, *r.TrajectoryID)
			}
			ti.rec = r
			if r.Reward == nil || math.IsNaN(*r.Reward) || math.IsInf(*r.Reward, 0) {
				t.Fatalf("line %d: bad reward", c.lines)
			}
			if r.NumSteps == nil || *r.NumSteps < 1 {
				t.Fatalf("line %d: bad num_steps", c.lines)
			}
			if *r.NumSteps < int64(cfg.MinSteps) || *r.NumSteps > int64(cfg.MaxSteps) {
				t.Fatalf("line %d: num_steps %d outside [%d,%d]", c.lines, *r.NumSteps, cfg.MinSteps, cfg.MaxSteps)
			}
			if r.TerminationReason != nil && !terms[*r.TerminationReason] {
				t.Fatalf("line %d: termination_reason %q", c.lines, *r.TerminationReason)
			}
			if r.GroupSize != nil && *r.GroupSize != int64(cfg.GroupSize) {
				t.Fatalf("line %d: group_size %d", c.lines, *r.GroupSize)
			}
			if r.StepID != nil || r.PromptIDs != nil {
				t.Fatalf("line %d: step fields on a trajectory record", c.lines)
			}
		default:
			t.Fatalf("line %d: type %q", c.lines, r.Type)
		}
	}

	// Completeness: every trajectory has its record and steps 0..n-1.
	for id, ti := range c.trajs {
		if ti.rec == nil {
			t.Fatalf("trajectory %s has steps but no trajectory record", id)
		}
		n := *ti.rec.NumSteps
		if int64(len(ti.steps)) != n {
			t.Fatalf("trajectory %s: %d steps, num_steps %d", id, len(ti.steps), n)
		}
		for k := int64(0); k < n; k++ {
			s := ti.steps[k]
			if s == nil {
				t.Fatalf("trajectory %s: step %d missing", id, k)
			}
			last := k == n-1
			if (s.Done != nil && *s.Done) != last {
				t.Fatalf("trajectory %s step %d: done=%v", id, k, s.Done)
			}
			if *s.TaskID != *ti.rec.TaskID {
				t.Fatalf("trajectory %s: task ids differ", id)
			}
			if k > 0 && cfg.Resets == 0 { // a reset starts a shorter context
				prev := ti.steps[k-1]
				if len(s.PromptIDs) <= len(prev.PromptIDs)+len(prev.ResponseIDs) {
					t.Fatalf("trajectory %s step %d: prompt %d not longer than previous turn %d+%d",
						id, k, len(s.PromptIDs), len(prev.PromptIDs), len(prev.ResponseIDs))
				}
				if !slices.Equal(s.PromptIDs[:len(prev.PromptIDs)], prev.PromptIDs) ||
					!slices.Equal(s.PromptIDs[len(prev.PromptIDs):len(prev.PromptIDs)+len(prev.ResponseIDs)], prev.ResponseIDs) {
					t.Fatalf("trajectory %s step %d: prompt does not extend the previous turn", id, k)
				}
				if len(s.Messages) > 0 && len(s.Messages) <= len(prev.Messages) {
					t.Fatalf("trajectory %s step %d: messages do not grow", id, k)
				}
			}
			if s.Reward != nil && !last && *s.Reward != 0 {
				t.Fatalf("trajectory %s step %d: non-final step reward %v", id, k, *s.Reward)
			}
			if s.Reward != nil && last && *s.Reward != *ti.rec.Reward {
				t.Fatalf("trajectory %s: last step reward %v, trajectory %v", id, *s.Reward, *ti.rec.Reward)
			}
		}
		c.groups[ti.key] = append(c.groups[ti.key], id)
	}
	for key, ids := range c.groups {
		if len(ids) != cfg.GroupSize {
			t.Fatalf("group %s has %d trajectories, want %d", key, len(ids), cfg.GroupSize)
		}
	}

	// The summary counts what is in the output.
	want := Summary{
		Groups:       int64(len(c.groups)),
		Trajectories: int64(c.trajectories),
		Steps:        int64(c.steps),
		Records:      int64(c.lines),
		Duplicates:   int64(c.dupLines),
		Bytes:        int64(len(out)),
	}
	if sum != want {
		t.Fatalf("summary %+v, counted %+v", sum, want)
	}
	nRoles := max(1, len(cfg.Roles))
	if sum.Groups != int64(cfg.Groups*nRoles) || sum.Trajectories != int64(cfg.Groups*nRoles*cfg.GroupSize) {
		t.Fatalf("summary %+v for %d groups x %d roles x %d", sum, cfg.Groups, nRoles, cfg.GroupSize)
	}
	return c
}

func checkStep(t *testing.T, line int, r *record, cfg Config, finishes map[string]bool) {
	t.Helper()
	if r.StepID == nil || r.StepIndex == nil || r.PolicyVersion == nil {
		t.Fatalf("line %d: missing step_id/step_index/policy_version", line)
	}
	if want := fmt.Sprintf("%s#%d", *r.TrajectoryID, *r.StepIndex); *r.StepID != want {
		t.Fatalf("line %d: step_id %q, want %q", line, *r.StepID, want)
	}
	if *r.StepIndex < 0 || *r.PolicyVersion < 0 || *r.PolicyVersion >= int64(cfg.PolicyVersions) {
		t.Fatalf("line %d: step_index %d policy_version %d", line, *r.StepIndex, *r.PolicyVersion)
	}
	if len(r.PromptIDs) == 0 || len(r.ResponseIDs) == 0 {
		t.Fatalf("line %d: empty prompt or response", line)
	}
	for _, ids := range [][]int64{r.PromptIDs, r.ResponseIDs} {
		for _, id := range ids {
			if id < 0 || id >= int64(cfg.Vocab) {
				t.Fatalf("line %d: token id %d outside [0,%d)", line, id, cfg.Vocab)
			}
		}
	}
	n := len(r.ResponseIDs)
	if n > max(1, cfg.ResponseLen*3/2) {
		t.Fatalf("line %d: response of %d tokens, mean %d", line, n, cfg.ResponseLen)
	}
	if len(r.ResponseLogprobs) != n {
		t.Fatalf("line %d: %d logprobs for %d tokens", line, len(r.ResponseLogprobs), n)
	}
	for _, lp := range [][]float64{r.ResponseLogprobs, r.TeacherLogprobs} {
		for _, x := range lp {
			if math.IsNaN(x) || math.IsInf(x, 0) || x > 0 {
				t.Fatalf("line %d: logprob %v", line, x)
			}
		}
	}
	if cfg.Teacher != (r.TeacherLogprobs != nil) || (r.TeacherLogprobs != nil && len(r.TeacherLogprobs) != n) {
		t.Fatalf("line %d: teacher_logprobs %d for %d tokens (Teacher %v)", line, len(r.TeacherLogprobs), n, cfg.Teacher)
	}
	if r.TokenVersions != nil {
		if !cfg.TokenVersions || len(r.TokenVersions) != n {
			t.Fatalf("line %d: token_versions %d for %d tokens", line, len(r.TokenVersions), n)
		}
		v := *r.PolicyVersion
		if r.TokenVersions[0] != v-1 || r.TokenVersions[n-1] != v {
			t.Fatalf("line %d: token_versions %v at version %d", line, r.TokenVersions, v)
		}
		for i := 1; i < n; i++ {
			if d := r.TokenVersions[i] - r.TokenVersions[i-1]; d < 0 || d > 1 {
				t.Fatalf("line %d: token_versions not a v-1 prefix then v: %v", line, r.TokenVersions)
			}
		}
	}
	if r.FinishReason != nil && !finishes[*r.FinishReason] {
		t.Fatalf("line %d: finish_reason %q", line, *r.FinishReason)
	}
	if r.CreatedAt != nil {
		ts, err := time.Parse(time.RFC3339Nano, *r.CreatedAt)
		if err != nil || len(*r.CreatedAt) != len("2026-11-29T21:00:00.123456Z") || ts.Location() != time.UTC {
			t.Fatalf("line %d: created_at %q: %v", line, *r.CreatedAt, err)
		}
	}
	if cfg.Messages != (r.Messages != nil) {
		t.Fatalf("line %d: messages present %v, Messages %v", line, r.Messages != nil, cfg.Messages)
	}
	if r.Messages != nil {
		if len(r.Messages) < 3 || r.Messages[0].Role != "system" || r.Messages[1].Role != "user" {
			t.Fatalf("line %d: messages do not start with system, user", line)
		}
		last := r.Messages[len(r.Messages)-1]
		if last.Role != "assistant" {
			t.Fatalf("line %d: last message role %q", line, last.Role)
		}
		if (*r.FinishReason == "tool_calls") != (len(last.ToolCalls) > 0) {
			t.Fatalf("line %d: finish_reason %s with %d tool calls", line, *r.FinishReason, len(last.ToolCalls))
		}
		calls := map[string]bool{}
		for _, m := range r.Messages {
			for _, tc := range m.ToolCalls {
				var args map[string]any
				if err := json.Unmarshal([]byte(tc.Function.Arguments), &args); err != nil {
					t.Fatalf("line %d: tool call arguments %q: %v", line, tc.Function.Arguments, err)
				}
				calls[tc.ID] = true
			}
			if m.Role == "tool" && !calls[m.ToolCallID] {
				t.Fatalf("line %d: tool message answers unknown call %q", line, m.ToolCallID)
			}
		}
	}
}

func isASCII(b []byte) bool {
	for _, c := range b {
		if c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

func smallConfig() Config {
	return Config{
		Groups: 40, GroupSize: 6, MinSteps: 1, MaxSteps: 5,
		PromptLen: 96, ResponseLen: 48,
		Messages: true, Teacher: true, TokenVersions: true,
		Seed: 7,
	}
}

func TestInvariants(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"defaults", Config{Groups: 12}},
		{"all-fields", smallConfig()},
		{"no-shuffle", func() Config { c := smallConfig(); c.Shuffle = -1; return c }()},
		{"full-shuffle", func() Config { c := smallConfig(); c.Shuffle = 1; c.Interleave = 3; return c }()},
		{"tiny", Config{Groups: 5, GroupSize: 1, MinSteps: 3, MaxSteps: 3, PromptLen: 1, ResponseLen: 1, Vocab: 7, PolicyVersions: 1, Interleave: 1, Messages: true, Teacher: true, TokenVersions: true}},
		{"one-step", Config{Groups: 30, GroupSize: 3, MinSteps: 1, MaxSteps: 1, ResponseLen: 2, PromptLen: 8}},
		{"long", Config{Groups: 4, GroupSize: 2, MinSteps: 20, MaxSteps: 30, PromptLen: 32, ResponseLen: 16, Messages: true}},
		{"agents", agentConfig()},
		{"agents-text", func() Config { c := agentConfig(); c.Tokens = TokensText; return c }()},
		{"tiny-text", Config{Groups: 5, GroupSize: 1, MinSteps: 3, MaxSteps: 3, PromptLen: 1, ResponseLen: 1, Vocab: 7, PolicyVersions: 1, Interleave: 1, Messages: true, Tokens: TokensText}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, sum := generate(t, tc.cfg)
			c := checkOutput(t, out, sum, tc.cfg)
			if len(c.order) >= 200 && (c.withGroupID == 0 || c.withGroupID > len(c.order)/5) {
				t.Errorf("%d of %d records carry group_id; want a few", c.withGroupID, len(c.order))
			}
		})
	}
}

func TestRealism(t *testing.T) {
	cfg := smallConfig()
	cfg.Groups = 200
	cfg.PolicyVersions = 5
	out, sum := generate(t, cfg)
	c := checkOutput(t, out, sum, cfg)
	cfg = cfg.withDefaults()

	var allRight, allWrong, mixed, fractional int
	var stale, spanning, steps, nonStop int
	finishes := map[string]int{}
	terms := map[string]int{}
	for key, ids := range c.groups {
		right := 0
		for _, id := range ids {
			ti := c.trajs[id]
			if ti.rec.IsCorrect != nil && *ti.rec.IsCorrect {
				right++
			}
			if r := *ti.rec.Reward; r != 0 && r != 1 {
				fractional++
			}
			terms[*ti.rec.TerminationReason]++
			task := 0
			if _, err := fmt.Sscanf(*ti.rec.TaskID, "task-%d", &task); err != nil {
				t.Fatalf("task id %q: %v", *ti.rec.TaskID, err)
			}
			want := int64(task * cfg.PolicyVersions / cfg.Groups)
			for _, s := range ti.steps {
				steps++
				switch v := *s.PolicyVersion; v {
				case want:
				case want - 1:
					stale++
				default:
					t.Fatalf("group %s task %d: policy_version %d, want %d", key, task, v, want)
				}
				if s.TokenVersions != nil {
					spanning++
				}
				finishes[*s.FinishReason]++
				if (s.Done == nil || !*s.Done) && *s.FinishReason != "tool_calls" {
					nonStop++
				}
			}
		}
		switch right {
		case 0:
			allWrong++
		case len(ids):
			allRight++
		default:
			mixed++
		}
	}
	t.Logf("groups: %d all right, %d all wrong, %d mixed; %d fractional rewards", allRight, allWrong, mixed, fractional)
	t.Logf("steps %d: %d stale, %d token_versions; finish %v; termination %v", steps, stale, spanning, finishes, terms)
	if allRight == 0 || allWrong == 0 || mixed == 0 || fractional == 0 {
		t.Errorf("reward distribution not realistic")
	}
	if stale < steps/20 || stale > steps/6 {
		t.Errorf("%d of %d steps stale, want ~10%%", stale, steps)
	}
	if spanning < steps/30 || spanning > steps/6 {
		t.Errorf("%d of %d steps with token_versions, want ~10%% of those with version >= 1", spanning, steps)
	}
	if finishes["stop"] == 0 || finishes["tool_calls"] == 0 || finishes["length"] == 0 {
		t.Errorf("finish reasons %v", finishes)
	}
	if nonStop != 0 {
		t.Errorf("%d non-final steps without tool_calls", nonStop)
	}
	if terms["ENV_DONE"] < c.trajectories*3/4 || terms["MAX_TURNS_EXCEEDED"] == 0 || terms["TIMEOUT"] == 0 {
		t.Errorf("termination reasons %v", terms)
	}
	if c.nonASCII == 0 || c.nonASCII > len(c.order)/4 {
		t.Errorf("%d of %d records have non-ASCII text", c.nonASCII, len(c.order))
	}
}

// TestOrder checks interleaving and displacement.
func TestOrder(t *testing.T) {
	stats := func(cfg Config) (trajFirst, outOfOrder, maxGroups int) {
		out, sum := generate(t, cfg)
		c := checkOutput(t, out, sum, cfg)
		nextStep := map[string]int64{}
		gotTraj := map[string]bool{}
		open := map[string]int{} // group -> records still to come
		for _, ids := range c.groups {
			for _, id := range ids {
				open[c.trajs[id].key] += 1 + int(*c.trajs[id].rec.NumSteps)
			}
		}
		inFlight := map[string]bool{}
		for _, r := range c.order {
			id := *r.TrajectoryID
			key := r.groupKey()
			inFlight[key] = true
			maxGroups = max(maxGroups, len(inFlight))
			if open[key]--; open[key] == 0 {
				delete(inFlight, key)
			}
			if r.Type == "trajectory" {
				if nextStep[id] < *r.NumSteps {
					trajFirst++
				}
				gotTraj[id] = true
				continue
			}
			if *r.StepIndex != nextStep[id] || gotTraj[id] {
				outOfOrder++
			}
			nextStep[id] = max(nextStep[id], *r.StepIndex+1)
		}
		return
	}

	cfg := smallConfig()
	cfg.Shuffle = -1
	cfg.Interleave = 4
	tf, ooo, mg := stats(cfg)
	if tf != 0 || ooo != 0 {
		t.Errorf("Shuffle<0: %d trajectory records early, %d steps out of order", tf, ooo)
	}
	if mg < 2 || mg > 4 {
		t.Errorf("Interleave 4: %d groups in flight", mg)
	}

	cfg.Interleave = 1
	if _, _, mg = stats(cfg); mg != 1 {
		t.Errorf("Interleave 1: %d groups in flight", mg)
	}

	cfg = smallConfig() // default shuffle 0.3, interleave 16
	tf, ooo, mg = stats(cfg)
	if tf == 0 || ooo == 0 {
		t.Errorf("default Shuffle: %d trajectory records early, %d steps out of order", tf, ooo)
	}
	if mg < 8 || mg > 16 {
		t.Errorf("Interleave 16: %d groups in flight", mg)
	}

	cfg.Roles = []string{"solver", "verifier"}
	cfg.Interleave = 6
	if _, _, mg = stats(cfg); mg > 6 || mg < 4 {
		t.Errorf("Interleave 6 with 2 roles: %d groups in flight", mg)
	}
}

func TestDuplicates(t *testing.T) {
	for _, frac := range []float64{0.05, 0.2, 1} {
		cfg := smallConfig()
		cfg.Groups = 100
		cfg.Duplicates = frac
		out, sum := generate(t, cfg)
		c := checkOutput(t, out, sum, cfg)
		unique := len(c.order)
		got := float64(c.dupLines) / float64(unique)
		t.Logf("Duplicates %.2f: %d duplicate lines of %d records (%.3f)", frac, c.dupLines, unique, got)
		if math.Abs(got-frac) > 0.02+0.1*frac {
			t.Errorf("Duplicates %.2f: got fraction %.3f", frac, got)
		}
	}
	cfg := smallConfig()
	_, sum := generate(t, cfg)
	if sum.Duplicates != 0 {
		t.Errorf("Duplicates 0: %d duplicate lines", sum.Duplicates)
	}
}

func TestDeterminism(t *testing.T) {
	cfg := smallConfig()
	cfg.Duplicates = 0.1
	cfg.Roles = []string{"a", "b"}
	a, _ := generate(t, cfg)
	b, _ := generate(t, cfg)
	if !bytes.Equal(a, b) {
		t.Fatalf("same seed gave different output")
	}
	cfg.Seed++
	c, _ := generate(t, cfg)
	if bytes.Equal(a, c) {
		t.Fatalf("different seeds gave the same output")
	}
}

func TestRoles(t *testing.T) {
	cfg := smallConfig()
	cfg.Groups = 10
	cfg.GroupSize = 4
	cfg.Roles = []string{"planner", "coder", `odd "role"/é`}
	out, sum := generate(t, cfg)
	c := checkOutput(t, out, sum, cfg)
	if len(c.groups) != 30 {
		t.Fatalf("%d groups, want 30", len(c.groups))
	}
	tasks := map[string]int{}
	for key, ids := range c.groups {
		task, role, ok := strings.Cut(key, ":")
		if !ok || !slices.Contains(cfg.Roles, role) {
			t.Fatalf("group key %q is not task_id:role", key)
		}
		tasks[task]++
		for _, id := range ids {
			if r := c.trajs[id].rec; *r.Role != role || *r.TaskID != task {
				t.Fatalf("trajectory %s: role %q task %q in group %q", id, *r.Role, *r.TaskID, key)
			}
		}
	}
	for task, n := range tasks {
		if n != len(cfg.Roles) {
			t.Fatalf("task %s has %d role groups", task, n)
		}
	}

	if _, err := Generate(context.Background(), io.Discard, Config{Roles: []string{""}}); err == nil {
		t.Fatalf("empty role accepted")
	}
}

func TestDefaults(t *testing.T) {
	c := Config{}.withDefaults()
	want := Config{Groups: 100, GroupSize: 8, MinSteps: 1, MaxSteps: 4, PromptLen: 512, ResponseLen: 256,
		Vocab: 151936, PolicyVersions: 4, Interleave: 16, Shuffle: 0.3}
	if fmt.Sprint(c) != fmt.Sprint(want) {
		t.Fatalf("defaults %+v, want %+v", c, want)
	}
	c = Config{MinSteps: 6, Shuffle: -1, Duplicates: 2}.withDefaults()
	if c.MaxSteps != 6 || c.Shuffle != 0 || c.Duplicates != 1 {
		t.Fatalf("clamping: %+v", c)
	}
}

func TestCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	sum, err := Generate(ctx, io.Discard, Config{Groups: 1000})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	if sum.Records > 1000 {
		t.Fatalf("wrote %d records after cancellation", sum.Records)
	}
}

type failWriter struct{ n int }

func (w *failWriter) Write(p []byte) (int, error) {
	if w.n += len(p); w.n > 3<<20 {
		return 0, errors.New("disk full")
	}
	return len(p), nil
}

func TestWriteError(t *testing.T) {
	_, err := Generate(context.Background(), &failWriter{}, Config{Groups: 1000})
	if err == nil || err.Error() != "disk full" {
		t.Fatalf("err %v, want disk full", err)
	}
}

// TestBoundedMemory checks that the live state does not grow with Groups.
func TestBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	cfg := Config{Groups: 1, GroupSize: 4, PromptLen: 64, ResponseLen: 16, Messages: true}
	var g *gen
	maxLive := func(groups int) int {
		cfg.Groups = groups
		g = newGen(io.Discard, cfg.withDefaults())
		peak := 0
		// Sample the number of trajectories in flight while running.
		w := &sampler{f: func() { peak = max(peak, len(g.active)) }}
		g.bw.Reset(w)
		if err := g.run(context.Background()); err != nil {
			t.Fatal(err)
		}
		_ = g.bw.Flush()
		return peak
	}
	// Interleave (16) tasks of GroupSize trajectories at most.
	if n := maxLive(3000); n == 0 || n > 16*cfg.GroupSize {
		t.Fatalf("%d trajectories in flight for 3000 groups", n)
	}
	if len(g.free) > 16*cfg.GroupSize {
		t.Fatalf("%d pooled trajectories", len(g.free))
	}
}

type sampler struct{ f func() }

func (s *sampler) Write(p []byte) (int, error) { s.f(); return len(p), nil }

func BenchmarkGenerate(b *testing.B) {
	for _, bc := range []struct {
		name string
		cfg  Config
	}{
		{"default", Config{Groups: 50, Messages: true, Seed: 1}},
		{"no-messages", Config{Groups: 50, Seed: 1}},
		{"teacher-dups", Config{Groups: 50, Messages: true, Teacher: true, TokenVersions: true, Duplicates: 0.05, Seed: 1}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			sum, err := Generate(context.Background(), io.Discard, bc.cfg)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(sum.Bytes)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for b.Loop() {
				if _, err := Generate(context.Background(), io.Discard, bc.cfg); err != nil {
					b.Fatal(err)
				}
			}
			elapsed := time.Since(start).Seconds()
			b.ReportMetric(float64(sum.Bytes)*float64(b.N)/elapsed/1e6, "MB/s")
		})
	}
}

func TestAppendUint32(t *testing.T) {
	for _, v := range []uint32{0, 1, 9, 10, 99, 100, 999, 1000, 9999, 10000, 99999, 100000, 151935, 999999, 1000000, 1 << 31, math.MaxUint32} {
		if got, want := string(appendUint32(nil, v)), fmt.Sprint(v); got != want {
			t.Errorf("appendUint32(%d) = %q", v, got)
		}
	}
	for v := uint32(0); v < 200000; v += 7 {
		if got, want := string(appendUint32(nil, v)), fmt.Sprint(v); got != want {
			t.Fatalf("appendUint32(%d) = %q", v, got)
		}
	}
}

func TestAppendLogprob(t *testing.T) {
	for _, x := range []uint32{0, 1, math.MaxUint32, 0xffffff, 51 << 24, 237 << 24, 236<<24 | 0xffffff} {
		s := string(appendLogprob(nil, x))
		var f float64
		if err := json.Unmarshal([]byte(s), &f); err != nil || f > 0 || f <= -10 {
			t.Errorf("appendLogprob(%#x) = %q (%v)", x, s, err)
		}
		digits := strings.TrimLeft(strings.NewReplacer("-", "", ".", "").Replace(s), "0")
		if len(digits) != 6 {
			t.Errorf("appendLogprob(%#x) = %q: want 6 significant digits", x, s)
		}
	}
}

// agentConfig is a multi-turn agent workload: long observations, resets,
// parallel tool calls.
func agentConfig() Config {
	return Config{Groups: 6, GroupSize: 4, MinSteps: 20, MaxSteps: 30, PromptLen: 300, ResponseLen: 40,
		ObservationLen: 120, Resets: 0.05, ParallelTools: 0.2, Messages: true, Teacher: true, Seed: 7}
}

// TestAgentTraces checks the structure of multi-turn agent traces: every
// step's prompt is its predecessor's prompt and response followed by the
// observations (the prefix chain), except after a context reset, which
// starts again from the task's first prompt turns; the messages follow
// the same chain; parallel tool calls are each answered; observations
// have the configured mean length.
func TestAgentTraces(t *testing.T) {
	for _, m := range []TokenModel{TokensRandom, TokensText} {
		t.Run(m.String(), func(t *testing.T) {
			cfg := agentConfig()
			cfg.Tokens = m
			checkAgentTraces(t, cfg)
		})
	}
}

func checkAgentTraces(t *testing.T, cfg Config) {
	out, sum := generate(t, cfg)
	c := checkOutput(t, out, sum, cfg)
	var chained, resets, parallel, observations, obsTokens int
	for id, ti := range c.trajs {
		var prev *record
		first := ti.steps[0]
		for k := int64(0); k < int64(len(ti.steps)); k++ {
			s := ti.steps[k]
			if s == nil {
				t.Fatalf("%s: step %d missing", id, k)
			}
			if prev == nil {
				prev = s
				continue
			}
			base := append(append([]int64(nil), prev.PromptIDs...), prev.ResponseIDs...)
			switch {
			case len(s.PromptIDs) > len(base) && slices.Equal(s.PromptIDs[:len(base)], base):
				chained++
				// The observations between: one tool response block per
				// call of the previous action.
				added := s.PromptIDs[len(base):]
				calls := len(prev.Messages[len(prev.Messages)-1].ToolCalls)
				if got := count(added, tokToolResp); got != calls {
					t.Fatalf("%s step %d: %d observations for %d tool calls", id, k, got, calls)
				}
				if calls > 1 {
					parallel++
				}
				observations += calls
				obsTokens += len(added) - 9 - 2*calls
				// Messages: the previous ones (its answer last), one tool
				// message per call, then this step's answer.
				if len(s.Messages) != len(prev.Messages)+calls+1 {
					t.Fatalf("%s step %d: %d messages after %d (+%d tool calls)", id, k, len(s.Messages), len(prev.Messages), calls)
				}
				for i := range prev.Messages {
					if !reflect.DeepEqual(s.Messages[i], prev.Messages[i]) {
						t.Fatalf("%s step %d: message %d differs from its predecessor's", id, k, i)
					}
				}
			default:
				// A reset: the task's system and user turns, then a summary.
				resets++
				head := first.PromptIDs[:len(first.PromptIDs)-3]
				if !slices.Equal(s.PromptIDs[:len(head)], head) {
					t.Fatalf("%s step %d: neither extends its predecessor nor restarts from the task", id, k)
				}
				if len(s.Messages) != 4 || !reflect.DeepEqual(s.Messages[:2], first.Messages[:2]) || !strings.HasPrefix(s.Messages[2].Content, "Summary of the work so far") {
					t.Fatalf("%s step %d: reset messages %+v", id, k, s.Messages)
				}
			}
			prev = s
		}
	}
	turns := chained + resets
	t.Logf("%d turns: %d chained, %d resets, %d with parallel calls, mean observation %d tokens",
		turns, chained, resets, parallel, obsTokens/max(observations, 1))
	if resets == 0 || resets > turns/8 {
		t.Errorf("%d resets in %d turns, want about 5%%", resets, turns)
	}
	if parallel == 0 || parallel > turns/2 {
		t.Errorf("%d turns after parallel calls in %d, want about 20%% of the tool calls", parallel, turns)
	}
	if mean := obsTokens / max(observations, 1); mean < 80 || mean > 170 {
		t.Errorf("mean observation %d tokens, want about %d", mean, cfg.ObservationLen)
	}
}

func count(ids []int64, tok int64) int {
	n := 0
	for _, id := range ids {
		if id == tok {
			n++
		}
	}
	return n
}

// TestWireDeltas: with WireDeltas the same trajectories are sent with
// prompt deltas wherever a prompt extends the previous step's, and the
// whole prompts rebuilt from them equal those sent whole.
func TestWireDeltas(t *testing.T) {
	cfg := agentConfig()
	whole, _ := generate(t, cfg)
	cfg.WireDeltas = true
	deltas, _ := generate(t, cfg)
	if len(deltas) >= len(whole)/4 {
		t.Fatalf("wire deltas: %d bytes against %d whole", len(deltas), len(whole))
	}
	type step struct {
		ID        string            `json:"step_id"`
		Type      string            `json:"type"`
		Prompt    []int64           `json:"prompt_ids"`
		Delta     []int64           `json:"prompt_delta_ids"`
		Parent    string            `json:"parent_step_id"`
		Response  []int64           `json:"response_ids"`
		StepIndex int64             `json:"step_index"`
		Messages  []json.RawMessage `json:"messages"`
		Added     []json.RawMessage `json:"messages_added"`
	}
	read := func(b []byte) map[string]*step {
		out := map[string]*step{}
		for _, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
			var s step
			if err := json.Unmarshal(l, &s); err != nil {
				t.Fatal(err)
			}
			if s.Type == "step" {
				out[s.ID] = &s
			}
		}
		return out
	}
	want, got := read(whole), read(deltas)
	var resolveMsgs func(s *step) []json.RawMessage
	resolveMsgs = func(s *step) []json.RawMessage {
		if s.Parent == "" {
			return s.Messages
		}
		return append(slices.Clone(resolveMsgs(got[s.Parent])), s.Added...)
	}
	var resolve func(s *step) []int64
	resolve = func(s *step) []int64 {
		if s.Parent == "" {
			return s.Prompt
		}
		p := got[s.Parent]
		if p == nil || p.StepIndex != s.StepIndex-1 {
			t.Fatalf("%s: parent %q is not the previous step", s.ID, s.Parent)
		}
		return slices.Concat(resolve(p), p.Response, s.Delta)
	}
	sent := 0
	for id, w := range want {
		g := got[id]
		if g == nil {
			t.Fatalf("step %s missing", id)
		}
		if g.Parent != "" {
			sent++
			if g.Prompt != nil {
				t.Fatalf("%s: both prompt_ids and a delta", id)
			}
		}
		if !slices.Equal(resolve(g), w.Prompt) {
			t.Fatalf("%s: the rebuilt prompt differs from the whole one", id)
		}
		if g.Parent != "" {
			pm := resolveMsgs(got[g.Parent])
			if len(g.Messages) != 0 || len(pm)+len(g.Added) != len(w.Messages) || !slices.EqualFunc(append(pm, g.Added...), w.Messages, func(a, b json.RawMessage) bool { return bytes.Equal(a, b) }) {
				t.Fatalf("%s: the messages rebuilt from messages_added differ", id)
			}
		}
	}
	if sent < len(want)/2 {
		t.Fatalf("only %d of %d steps sent as deltas", sent, len(want))
	}
}

// TestTextTokens checks what the text model is for: ids a compressor can
// find structure in, as in a tokenizer's output, unlike the random model's;
// one system prompt for the run; observations that repeat earlier ones.
func TestTextTokens(t *testing.T) {
	type stats struct {
		ratio   float64 // zstd size / raw size of the new tokens, 4 bytes each
		systems int     // distinct system prompts
		obs     int     // observations
		repeats int     // observations equal to an earlier one of their trajectory
	}
	measure := func(t *testing.T, m TokenModel) stats {
		cfg := agentConfig()
		cfg.Groups, cfg.Tokens, cfg.Seed = 12, m, 3
		out, sum := generate(t, cfg)
		c := checkOutput(t, out, sum, cfg)
		var st stats
		var raw []byte
		systems := map[string]bool{}
		for _, id := range slices.Sorted(maps.Keys(c.trajs)) {
			ti := c.trajs[id]
			seen := map[string]bool{}
			var prev *record
			for k := range int64(len(ti.steps)) {
				s := ti.steps[k]
				if prev == nil {
					// <|im_start|>system\n … <|im_end|>
					end := slices.Index(s.PromptIDs, tokImEnd)
					systems[fmt.Sprint(s.PromptIDs[3:end])] = true
					raw = appendIDs(raw, s.PromptIDs)
				} else if base := slices.Concat(prev.PromptIDs, prev.ResponseIDs); len(s.PromptIDs) > len(base) && slices.Equal(s.PromptIDs[:len(base)], base) {
					added := s.PromptIDs[len(base):]
					raw = appendIDs(raw, added)
					for len(added) > 0 {
						i := slices.Index(added, tokToolResp)
						if i < 0 {
							break
						}
						j := slices.Index(added[i:], tokToolRespEnd)
						o := fmt.Sprint(added[i+1 : i+j])
						st.obs++
						if seen[o] {
							st.repeats++
						}
						seen[o] = true
						added = added[i+j:]
					}
				}
				raw = appendIDs(raw, s.ResponseIDs)
				prev = s
			}
		}
		enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault))
		if err != nil {
			t.Fatal(err)
		}
		st.ratio = float64(len(enc.EncodeAll(raw, nil))) / float64(len(raw))
		st.systems = len(systems)
		return st
	}
	random, text := measure(t, TokensRandom), measure(t, TokensText)
	t.Logf("random: %+v; text: %+v", random, text)
	if random.ratio < 0.5 {
		t.Errorf("random ids compress to %.2f of 4 bytes each: want little structure", random.ratio)
	}
	if text.ratio > 0.8*random.ratio {
		t.Errorf("text ids compress to %.2f, random ones to %.2f: want text clearly more compressible", text.ratio, random.ratio)
	}
	if random.systems != 12 || text.systems != 1 {
		t.Errorf("distinct system prompts: random %d (want one per task, 12), text %d (want 1)", random.systems, text.systems)
	}
	if random.repeats != 0 || text.repeats < text.obs/10 || text.repeats > text.obs/3 {
		t.Errorf("repeated observations: random %d of %d (want 0), text %d of %d (want about %.0f%%)",
			random.repeats, random.obs, text.repeats, text.obs, 100*repeatObservation)
	}
}

// appendIDs appends ids as little-endian int32s.
func appendIDs(b []byte, ids []int64) []byte {
	for _, id := range ids {
		b = binary.LittleEndian.AppendUint32(b, uint32(id))
	}
	return b
}

func TestParseTokenModel(t *testing.T) {
	for _, m := range []TokenModel{TokensRandom, TokensText} {
		if got, err := ParseTokenModel(m.String()); err != nil || got != m {
			t.Errorf("ParseTokenModel(%q) = %v, %v", m, got, err)
		}
	}
	if _, err := ParseTokenModel("zipf"); err == nil {
		t.Error("ParseTokenModel(zipf): no error")
	}
}
