package synth

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"strconv"
	"time"
)

// Config describes the synthetic dataset. The zero value of every field
// means "use the default" (see withDefaults), except Teacher, TokenVersions,
// Messages, Roles, Duplicates, Tokens and Seed, whose zero values are
// meaningful.
type Config struct {
	// Groups is the number of tasks; each task yields one group, or one
	// group per role when Roles is set. Default 100.
	Groups int
	// GroupSize is the number of trajectories per group. Default 8.
	GroupSize int
	// MinSteps and MaxSteps bound the steps per trajectory (uniform).
	// Defaults 1 and 4.
	MinSteps, MaxSteps int
	// PromptLen is the mean first-turn prompt length in tokens (varies
	// +-25% per group). Default 512.
	PromptLen int
	// ResponseLen is the mean response length in tokens (varies +-50%, at
	// least 1). Default 256.
	ResponseLen int
	// Vocab bounds token ids to [0, Vocab). Default 151936.
	Vocab int
	// PolicyVersions is the number of policy versions over the run: group
	// g gets version floor(g*PolicyVersions/Groups) and ~10% of steps are
	// dispatched one version earlier (never below 0). Default 4.
	PolicyVersions int
	// Interleave is the number of groups in flight at once; records of up
	// to this many groups are interleaved. With Roles, whole tasks are in
	// flight: max(1, Interleave/len(Roles)) of them. Default 16.
	Interleave int
	// Shuffle is the fraction in [0,1] of records displaced out of order
	// within their trajectory (a trajectory record may come before its
	// steps, steps may come out of order). Default 0.3; a negative value
	// means no displacement.
	Shuffle float64
	// Teacher adds teacher_logprobs to every step.
	Teacher bool
	// TokenVersions adds token_versions to ~10% of steps whose policy
	// version is >= 1 (a generation spanning a weight update: a prefix at
	// v-1, the rest at v).
	TokenVersions bool
	// Messages adds the OpenAI chat messages of each call.
	Messages bool
	// Roles, when non-empty, makes every task multi-agent: each rollout
	// has one trajectory per role, records carry the role and the group
	// key is task_id:role, so each task yields len(Roles) groups.
	Roles []string
	// Duplicates is the fraction in [0,1] of records emitted twice (the
	// exact same line, as a producer retry would). Default 0.
	Duplicates float64
	// ObservationLen is the mean length in tokens of a tool observation
	// appended to the context after each action: lognormal with a heavy
	// tail (file contents, test output), at least 4 and at most 16 times
	// the mean. 0 keeps short observations of 8 to 127 tokens.
	ObservationLen int
	// Resets is the probability that a turn after the first starts from a
	// fresh context (system prompt, task and a summary of the work so
	// far) instead of the whole conversation: the prefix chain breaks
	// there, in the tokens and in the messages.
	Resets float64
	// ParallelTools is the probability that an action makes 2 or 3 tool
	// calls at once, each answered by its own observation.
	ParallelTools float64
	// WireDeltas sends a step whose prompt extends its predecessor's
	// prompt and response as parent_step_id and prompt_delta_ids instead
	// of prompt_ids, and its messages as messages_added (the wire
	// format's deltas).
	WireDeltas bool
	// Tokens is how token ids are drawn: TokensRandom (the zero value) or
	// TokensText, ids like a tokenizer's output of text, with the
	// repetition real agents' contexts have.
	Tokens TokenModel
	// Seed seeds the generator; the same Config gives the same bytes.
	Seed uint64
}

// Summary counts what Generate wrote.
type Summary struct {
	// Groups is the number of groups (tasks, times len(Roles) if set).
	Groups int64
	// Trajectories and Steps count distinct trajectory and step records.
	Trajectories int64
	Steps        int64
	// Records is the number of lines written, duplicates included.
	Records int64
	// Duplicates is the number of extra lines that repeat an earlier one.
	Duplicates int64
	// Bytes is the number of bytes written.
	Bytes int64
}

func (c Config) withDefaults() Config {
	if c.Groups <= 0 {
		c.Groups = 100
	}
	if c.GroupSize <= 0 {
		c.GroupSize = 8
	}
	if c.MinSteps <= 0 {
		c.MinSteps = 1
	}
	if c.MaxSteps <= 0 {
		c.MaxSteps = max(4, c.MinSteps)
	}
	if c.MaxSteps < c.MinSteps {
		c.MaxSteps = c.MinSteps
	}
	if c.PromptLen <= 0 {
		c.PromptLen = 512
	}
	if c.ResponseLen <= 0 {
		c.ResponseLen = 256
	}
	if c.Vocab <= 0 {
		c.Vocab = 151936
	}
	if c.PolicyVersions <= 0 {
		c.PolicyVersions = 4
	}
	if c.Interleave <= 0 {
		c.Interleave = 16
	}
	switch {
	case c.Shuffle == 0:
		c.Shuffle = 0.3
	case c.Shuffle < 0 || math.IsNaN(c.Shuffle):
		c.Shuffle = 0
	case c.Shuffle > 1:
		c.Shuffle = 1
	}
	c.Duplicates = clamp01(c.Duplicates)
	c.Resets = clamp01(c.Resets)
	c.ParallelTools = clamp01(c.ParallelTools)
	if c.ObservationLen < 0 {
		c.ObservationLen = 0
	}
	return c
}

// clamp01 clamps a probability to [0, 1] (NaN: 0).
func clamp01(p float64) float64 {
	switch {
	case p < 0 || math.IsNaN(p):
		return 0
	case p > 1:
		return 1
	}
	return p
}

// Generate writes the dataset described by cfg to w as JSON lines and
// returns what it wrote. It stops early with ctx.Err() when ctx is done
// (after flushing the lines generated so far).
func Generate(ctx context.Context, w io.Writer, cfg Config) (Summary, error) {
	cfg = cfg.withDefaults()
	for _, r := range cfg.Roles {
		if r == "" {
			return Summary{}, errors.New("synth: empty role name")
		}
	}
	g := newGen(w, cfg)
	err := g.run(ctx)
	if ferr := g.bw.Flush(); err == nil && ferr != nil {
		err = ferr
	}
	return g.sum, err
}

// Special token ids (Qwen2 chat template), taken modulo Vocab.
const (
	tokImStart     = 151644
	tokImEnd       = 151645
	tokNewline     = 198
	tokSystem      = 8948
	tokUser        = 872
	tokAssistant   = 77091
	tokToolCall    = 151657
	tokToolCallEnd = 151658
	tokToolResp    = 151665
	tokToolRespEnd = 151666
)

// wordsPerToken sizes message text relative to the token counts.
const wordsPerToken = 0.6

// Finish reasons and termination reasons.
const (
	finStop = iota
	finToolCalls
	finLength
	finAbort
)

var finishNames = [...]string{"stop", "tool_calls", "length", "abort"}

const (
	termEnvDone = iota
	termMaxTurns
	termTimeout
	termError
)

var termNames = [...]string{"ENV_DONE", "MAX_TURNS_EXCEEDED", "TIMEOUT", "ERROR"}

// baseTime is the (deterministic) start of the synthetic run.
var baseTime = time.Date(2026, 11, 29, 21, 0, 0, 0, time.UTC).UnixMicro()

// group is one (task, role) group in flight.
type group struct {
	task       int
	qTaskID    []byte // JSON string literal
	qRole      []byte // JSON string literal, nil without roles
	qGroupKey  []byte // JSON string literal
	roleSystem string // system prompt body
	version    int
	difficulty float64
	shaped     bool // fractional shaped rewards
	stepReward bool // steps carry reward
	dataset    string
	env        string
	start      int64 // micros
	promptTok  []byte
	promptMsgs []byte
	answer     int
	left       *int // trajectories of the task not finished yet
}

// traj is one trajectory in flight.
type traj struct {
	g       *group
	idBody  []byte // trajectory id, escaped, without quotes
	rollout int
	n       int
	pending []int // record indices still to emit; n is the trajectory record
	correct bool
	reward  float64
	term    int
	start   int64

	built     bool
	tok       []byte
	promptBeg []int // where step k's prompt starts in tok (a reset starts anew)
	promptEnd []int
	msgBeg    []int
	respEnd   []int
	respN     []int
	msgs      []byte
	msgEnd    []int
	finish    []int
	version   []int
	tvSplit   []int
	created   []int64
	latency   []int
	obs       [][2]int // where each observation's tokens are in tok
}

type dup struct {
	line []byte
	due  int64
}

type gen struct {
	cfg      Config
	r        *rand.Rand
	bw       *bufio.Writer
	sum      Summary
	line     []byte
	active   []*traj
	free     []*traj
	nextTask int
	inFlight int // tasks in flight
	roles    [][]byte
	roleSys  []string
	dups     []dup
	dupFree  [][]byte
	maxResp  int
	numLines int64
	text     *textTokens // TokensText's state; nil for TokensRandom
}

func newGen(w io.Writer, cfg Config) *gen {
	g := &gen{
		cfg:     cfg,
		r:       rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		bw:      bufio.NewWriterSize(w, 1<<20),
		line:    make([]byte, 0, 64<<10),
		maxResp: max(1, cfg.ResponseLen+cfg.ResponseLen/2),
	}
	if cfg.Tokens == TokensText {
		g.text = newTextTokens(g.r)
	}
	nRoles := max(1, len(cfg.Roles))
	g.inFlight = max(1, cfg.Interleave/nRoles)
	for _, role := range cfg.Roles {
		g.roles = append(g.roles, appendJSONString(nil, role))
		g.roleSys = append(g.roleSys, roleSystemPrompt(role))
	}
	g.sum.Groups = int64(cfg.Groups) * int64(nRoles)
	return g
}

func (g *gen) tokID(t int) int { return t % g.cfg.Vocab }

// appendTok appends one token id and a comma.
func (g *gen) appendTok(b []byte, t int) []byte {
	b = appendUint32(b, uint32(g.tokID(t)))
	return append(b, ',')
}

// appendRandTok appends n random token ids, each followed by a comma. Ids
// are skewed towards small values (frequent BPE merges have small ids), with
// a uniform tail; one 64-bit draw yields two ids.
func (g *gen) appendRandTok(b []byte, n int) []byte {
	v := float64(g.cfg.Vocab)
	vmax := uint32(g.cfg.Vocab - 1)
	var x uint64
	for i := 0; i < n; i++ {
		if i&1 == 0 {
			x = g.r.Uint64()
		} else {
			x >>= 32
		}
		f := float64(uint32(x)>>3) * (1.0 / (1 << 29))
		if x&7 != 0 {
			f = f * f * f
		}
		b = appendUint32(b, min(uint32(f*v), vmax))
		b = append(b, ',')
	}
	return b
}

const digitPairs = "00010203040506070809" +
	"10111213141516171819" +
	"20212223242526272829" +
	"30313233343536373839" +
	"40414243444546474849" +
	"50515253545556575859" +
	"60616263646566676869" +
	"70717273747576777879" +
	"80818283848586878889" +
	"90919293949596979899"

// appendUint32 appends v in decimal; a faster strconv.AppendUint for the
// small values of token ids.
func appendUint32(b []byte, v uint32) []byte {
	if v >= 1000000 {
		return strconv.AppendUint(b, uint64(v), 10)
	}
	switch {
	case v < 10:
		return append(b, byte('0'+v))
	case v < 100:
		return append(b, digitPairs[2*v], digitPairs[2*v+1])
	case v < 10000:
		hi, lo := v/100, v%100
		if hi < 10 {
			return append(b, byte('0'+hi), digitPairs[2*lo], digitPairs[2*lo+1])
		}
		return append(b, digitPairs[2*hi], digitPairs[2*hi+1], digitPairs[2*lo], digitPairs[2*lo+1])
	default:
		hi, mid, lo := v/10000, v/100%100, v%100
		if hi < 10 {
			return append(b, byte('0'+hi), digitPairs[2*mid], digitPairs[2*mid+1], digitPairs[2*lo], digitPairs[2*lo+1])
		}
		return append(b, digitPairs[2*hi], digitPairs[2*hi+1], digitPairs[2*mid], digitPairs[2*mid+1], digitPairs[2*lo], digitPairs[2*lo+1])
	}
}

// vary returns mean scaled by a uniform factor in [1-frac, 1+frac], >= 1.
func (g *gen) vary(mean int, frac float64) int {
	f := 1 + frac*(2*g.r.Float64()-1)
	return max(1, int(math.Round(float64(mean)*f)))
}

func (g *gen) run(ctx context.Context) error {
	for g.nextTask < g.cfg.Groups && g.nextTask < g.inFlight {
		g.admit()
	}
	var n int
	for len(g.active) > 0 {
		if n++; n&255 == 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			default:
			}
		}
		i := g.r.IntN(len(g.active))
		t := g.active[i]
		var rec int
		if len(t.pending) > 1 && g.cfg.Shuffle > 0 && g.r.Float64() < g.cfg.Shuffle {
			j := 1 + g.r.IntN(len(t.pending)-1)
			rec = t.pending[j]
			t.pending = append(t.pending[:j], t.pending[j+1:]...)
		} else {
			rec = t.pending[0]
			t.pending = t.pending[1:]
		}
		g.line = g.line[:0]
		if rec == t.n {
			g.line = g.appendTrajectory(g.line, t)
			g.sum.Trajectories++
		} else {
			if !t.built {
				g.build(t)
			}
			g.line = g.appendStep(g.line, t, rec)
			g.sum.Steps++
		}
		if err := g.emit(g.line); err != nil {
			return err
		}
		if len(t.pending) == 0 {
			last := len(g.active) - 1
			g.active[i] = g.active[last]
			g.active[last] = nil
			g.active = g.active[:last]
			gr := t.g
			g.release(t)
			if *gr.left--; *gr.left == 0 && g.nextTask < g.cfg.Groups {
				g.admit()
			}
		}
	}
	// Flush retries still pending.
	for len(g.dups) > 0 {
		if err := g.writeDue(math.MaxInt64); err != nil {
			return err
		}
	}
	return nil
}

// emit writes one line (and schedules a duplicate of it).
func (g *gen) emit(line []byte) error {
	if err := g.write(line); err != nil {
		return err
	}
	if g.cfg.Duplicates > 0 && g.r.Float64() < g.cfg.Duplicates {
		var c []byte
		if k := len(g.dupFree); k > 0 {
			c = g.dupFree[k-1][:0]
			g.dupFree = g.dupFree[:k-1]
		}
		c = append(c, line...)
		g.dups = append(g.dups, dup{line: c, due: g.numLines + int64(g.r.IntN(8))})
	}
	if len(g.dups) > 0 {
		return g.writeDue(g.numLines)
	}
	return nil
}

// writeDue writes the scheduled duplicates due at or before now.
func (g *gen) writeDue(now int64) error {
	k := 0
	for _, d := range g.dups {
		if d.due <= now {
			if err := g.write(d.line); err != nil {
				return err
			}
			g.sum.Duplicates++
			g.dupFree = append(g.dupFree, d.line)
			continue
		}
		g.dups[k] = d
		k++
	}
	clear(g.dups[k:])
	g.dups = g.dups[:k]
	return nil
}

func (g *gen) write(line []byte) error {
	if _, err := g.bw.Write(line); err != nil {
		return err
	}
	g.numLines++
	g.sum.Records++
	g.sum.Bytes += int64(len(line))
	return nil
}

func (g *gen) newTraj() *traj {
	if k := len(g.free); k > 0 {
		t := g.free[k-1]
		g.free = g.free[:k-1]
		return t
	}
	return &traj{}
}

func (g *gen) release(t *traj) {
	t.g = nil
	t.built = false
	g.free = append(g.free, t)
}

// admit starts the next task: its groups and all their trajectories.
func (g *gen) admit() {
	cfg := &g.cfg
	task := g.nextTask
	g.nextTask++

	var taskID []byte
	taskID = append(taskID, "task-"...)
	taskID = appendPadded(taskID, task, 6)

	// Task-level properties shared by all roles.
	var difficulty float64
	switch u := g.r.Float64(); {
	case u < 0.2:
		difficulty = 0.05 * g.r.Float64() // nearly always wrong
	case u < 0.4:
		difficulty = 1 - 0.05*g.r.Float64() // nearly always right
	default:
		difficulty = g.r.Float64()
	}
	version := int(int64(task) * int64(cfg.PolicyVersions) / int64(cfg.Groups))
	shaped := g.r.IntN(100) < 30
	stepReward := g.r.IntN(100) < 30
	start := baseTime + int64(task)*2_500_000 + int64(g.r.IntN(1_000_000))
	dataset := datasets[g.r.IntN(len(datasets))]
	env := envs[g.r.IntN(len(envs))]
	answer := g.r.IntN(1000)

	nRoles := max(1, len(cfg.Roles))
	groups := make([]*group, nRoles)
	left := new(int)
	*left = cfg.GroupSize * nRoles // the task leaves the window as a whole
	qTask := appendJSONString(nil, string(taskID))
	userWords := int(float64(g.vary(cfg.PromptLen, 0.25)) * 0.8 * wordsPerToken)
	user := g.userContent(userWords)
	for ri := range groups {
		gr := &group{
			task: task, qTaskID: qTask, version: version, difficulty: difficulty,
			shaped: shaped, stepReward: stepReward, dataset: dataset, env: env,
			start: start, answer: answer, left: left,
		}
		if len(cfg.Roles) > 0 {
			gr.qRole = g.roles[ri]
			gr.qGroupKey = appendJSONString(nil, string(taskID)+":"+cfg.Roles[ri])
			gr.roleSystem = g.roleSys[ri]
		} else {
			gr.qGroupKey = qTask
			gr.roleSystem = systemPrompts[g.r.IntN(len(systemPrompts))]
		}
		g.buildPrompt(gr, user)
		groups[ri] = gr
	}
	for rollout := 0; rollout < cfg.GroupSize; rollout++ {
		for ri, gr := range groups {
			t := g.newTraj()
			t.g = gr
			t.rollout = rollout
			t.idBody = append(t.idBody[:0], gr.qTaskID[1:len(gr.qTaskID)-1]...)
			t.idBody = append(t.idBody, "/r"...)
			t.idBody = strconv.AppendInt(t.idBody, int64(rollout), 10)
			if len(cfg.Roles) > 0 {
				t.idBody = append(t.idBody, '/')
				t.idBody = append(t.idBody, g.roles[ri][1:len(g.roles[ri])-1]...)
			}
			g.decide(t)
			g.active = append(g.active, t)
		}
	}
}

// appendPadded appends v in decimal, zero-padded to width digits.
func appendPadded(b []byte, v, width int) []byte {
	var tmp [20]byte
	s := strconv.AppendInt(tmp[:0], int64(v), 10)
	for i := len(s); i < width; i++ {
		b = append(b, '0')
	}
	return append(b, s...)
}

// userContent returns the escaped body of the task's user message.
func (g *gen) userContent(nWords int) []byte {
	b := append([]byte(nil), userPrefixes[g.r.IntN(len(userPrefixes))]...)
	b = appendWords(b, g.r, max(3, nWords))
	b = append(b, '?')
	return appendMaybeUnicode(b, g.r)
}

// buildPrompt renders the first-turn prompt tokens and messages of gr.
func (g *gen) buildPrompt(gr *group, user []byte) {
	plen := g.vary(g.cfg.PromptLen, 0.25)
	sysN := max(1, plen/8)
	userN := max(1, plen-sysN-11)
	b := make([]byte, 0, (plen+16)*7)
	b = g.appendTok(b, tokImStart)
	b = g.appendTok(b, tokSystem)
	b = g.appendTok(b, tokNewline)
	b = g.appendSystemToks(b, sysN)
	b = g.appendTok(b, tokImEnd)
	b = g.appendTok(b, tokNewline)
	b = g.appendTok(b, tokImStart)
	b = g.appendTok(b, tokUser)
	b = g.appendTok(b, tokNewline)
	b = g.appendToks(b, userN)
	b = g.appendTok(b, tokImEnd)
	b = g.appendTok(b, tokNewline)
	b = g.appendTok(b, tokImStart)
	b = g.appendTok(b, tokAssistant)
	b = g.appendTok(b, tokNewline)
	gr.promptTok = b

	m := make([]byte, 0, len(gr.roleSystem)+len(user)+64)
	m = append(m, `{"role":"system","content":"`...)
	m = append(m, gr.roleSystem...)
	m = append(m, `"},{"role":"user","content":"`...)
	m = append(m, user...)
	m = append(m, `"},`...)
	gr.promptMsgs = m
}

// decide fixes the outcome of a trajectory: steps, termination, reward.
func (g *gen) decide(t *traj) {
	cfg := &g.cfg
	gr := t.g
	t.n = cfg.MinSteps + g.r.IntN(cfg.MaxSteps-cfg.MinSteps+1)
	switch u := g.r.IntN(100); {
	case u < 88:
		t.term = termEnvDone
	case u < 94:
		t.term = termMaxTurns
		t.n = cfg.MaxSteps
	case u < 98:
		t.term = termTimeout
	default:
		t.term = termError
	}
	t.correct = t.term == termEnvDone && g.r.Float64() < gr.difficulty
	switch {
	case t.correct:
		t.reward = 1
		if gr.shaped && g.r.IntN(4) == 0 {
			t.reward = 0.9 // correct but long: length penalty
		}
	case gr.shaped:
		switch g.r.IntN(3) {
		case 0:
			t.reward = 0.5 // partial credit
		case 1:
			t.reward = 0.1 // format reward only
		default:
			t.reward = 0
		}
	default:
		t.reward = 0
	}
	t.start = gr.start + int64(t.rollout)*1500 + int64(g.r.IntN(200_000))
	t.pending = t.pending[:0]
	for k := 0; k <= t.n; k++ {
		t.pending = append(t.pending, k)
	}
}

// build renders the conversation of a trajectory: one token stream and one
// message list that every step slices a prefix of. (The random draws
// happen in a fixed order: a seed gives the same traces.)
func (g *gen) build(t *traj) {
	cfg := &g.cfg
	gr := t.g
	n := t.n
	t.built = true
	t.reset(gr.promptTok, gr.promptMsgs, cfg.Messages)
	now := t.start
	segTok, segMsg := 0, 0 // where the current context starts
	for k := 0; k < n; k++ {
		last := k == n-1
		t.promptBeg = append(t.promptBeg, segTok)
		t.msgBeg = append(t.msgBeg, segMsg)
		fin := g.finishOf(t, last)
		rl := min(g.vary(cfg.ResponseLen, 0.5), g.maxResp)
		switch fin {
		case finLength:
			rl = g.maxResp
		case finAbort:
			rl = 1 + g.r.IntN(rl)
		}

		v := gr.version
		if v > 0 && g.r.IntN(10) == 0 {
			v-- // stale dispatch
		}
		split := 0
		if cfg.TokenVersions && v > 0 && rl >= 2 && g.r.IntN(10) == 0 {
			split = 1 + g.r.IntN(rl-1)
		}

		t.promptEnd = append(t.promptEnd, len(t.tok))
		calls := g.appendResponse(t, k, fin, rl)
		t.respEnd = append(t.respEnd, len(t.tok))
		t.respN = append(t.respN, rl)

		var sn snippet
		if fin == finToolCalls {
			sn = snippets[g.r.IntN(len(snippets))]
		}
		if cfg.Messages {
			g.appendAssistant(t, k, fin, rl, calls, sn)
		}

		latency := 20*rl + g.r.IntN(400)
		now += int64(latency) * 1000
		t.created = append(t.created, now)
		t.latency = append(t.latency, latency)
		t.finish = append(t.finish, fin)
		t.version = append(t.version, v)
		t.tvSplit = append(t.tvSplit, split)

		if last {
			continue
		}
		if cfg.Resets > 0 && g.r.Float64() < cfg.Resets {
			// The agent's context is summarised: the next prompt is the
			// system prompt, the task and the summary, not the history.
			segTok, segMsg = len(t.tok), len(t.msgs)
			g.appendReset(t)
		} else {
			// Tool turn: becomes part of the next prompt.
			g.appendObservations(t, k, max(calls, 1), sn)
		}
		now += int64(50_000 + g.r.IntN(2_000_000)) // tool execution
	}
}

// reset empties t's per-step slices and starts its context with the
// group's prompt (tokens, and messages when kept).
func (t *traj) reset(promptTok, promptMsgs []byte, messages bool) {
	t.promptBeg = t.promptBeg[:0]
	t.promptEnd = t.promptEnd[:0]
	t.msgBeg = t.msgBeg[:0]
	t.respEnd = t.respEnd[:0]
	t.respN = t.respN[:0]
	t.msgEnd = t.msgEnd[:0]
	t.finish = t.finish[:0]
	t.version = t.version[:0]
	t.tvSplit = t.tvSplit[:0]
	t.created = t.created[:0]
	t.latency = t.latency[:0]
	t.obs = t.obs[:0]
	t.tok = append(t.tok[:0], promptTok...)
	if messages {
		t.msgs = append(t.msgs[:0], promptMsgs...)
	}
}

// finishOf is how a step of t ends: tool calls, but for the last step,
// which ends as its trajectory's termination says.
func (g *gen) finishOf(t *traj, last bool) int {
	if !last {
		return finToolCalls
	}
	switch t.term {
	case termEnvDone:
		if !t.correct && g.r.IntN(12) == 0 {
			return finLength
		}
		return finStop
	case termTimeout:
		return finAbort
	case termError:
		return finStop
	}
	return finToolCalls // termMaxTurns
}

// appendResponse appends the rl tokens of step k's response, ending as
// fin says, to t's token stream; it returns the tool calls it made.
func (g *gen) appendResponse(t *traj, k, fin, rl int) (calls int) {
	cfg := &g.cfg
	switch fin {
	case finToolCalls:
		think := max(0, rl-3-rl/4)
		if calls = 1; cfg.ParallelTools > 0 && g.r.Float64() < cfg.ParallelTools {
			calls = 2 + g.r.IntN(2)
			if rl-think-1 < 3*calls { // too short for the calls' templates
				calls = 1
			}
		}
		args := rl - think - 1 - 2*calls // argument tokens of all the calls
		t.tok = g.appendToks(t.tok, think)
		for c := range calls {
			t.tok = g.appendTok(t.tok, tokToolCall)
			t.tok = g.appendToks(t.tok, args/calls+boolInt(c < args%calls))
			t.tok = g.appendTok(t.tok, tokToolCallEnd)
		}
		t.tok = g.appendTok(t.tok, tokImEnd)
		if rl < 3 { // too short for the template: trim to rl tokens
			t.tok = g.trimTokens(t.tok, t.promptEnd[k], rl)
		}
	case finStop:
		t.tok = g.appendToks(t.tok, rl-1)
		t.tok = g.appendTok(t.tok, tokImEnd)
	default:
		t.tok = g.appendToks(t.tok, rl)
	}
	return calls
}

// appendAssistant appends step k's assistant message (its text, the
// final answer of a stop, its tool calls) to t's messages.
func (g *gen) appendAssistant(t *traj, k, fin, rl, calls int, sn snippet) {
	gr := t.g
	m := t.msgs
	m = append(m, `{"role":"assistant","content":"`...)
	switch fin {
	case finToolCalls:
		m = appendWords(m, g.r, max(1, int(float64(rl-rl/4)*wordsPerToken)))
		m = append(m, ". Let me check this with python."...)
	default:
		m = appendWords(m, g.r, max(1, int(float64(rl)*wordsPerToken)))
		if fin == finStop {
			m = append(m, finalPhrases[g.r.IntN(len(finalPhrases))]...)
			ans := gr.answer
			if !t.correct {
				ans = (ans + 1 + g.r.IntN(99)) % 1000
			}
			m = strconv.AppendInt(m, int64(ans), 10)
			m = append(m, "}."...)
		}
	}
	m = appendMaybeUnicode(m, g.r)
	m = append(m, '"')
	if fin == finToolCalls {
		m = append(m, `,"tool_calls":[`...)
		for c := range calls {
			if c > 0 {
				m = append(m, ',')
			}
			m = append(m, `{"id":"call_`...)
			m = appendCallID(m, k, c)
			m = append(m, `","type":"function","function":{"name":"python","arguments":"`...)
			m = append(m, sn.args...)
			m = append(m, `"}}`...)
		}
		m = append(m, ']')
	}
	m = append(m, '}')
	t.msgEnd = append(t.msgEnd, len(m))
	m = append(m, ',')
	t.msgs = m
}

// appendObservations appends the tool turn answering the calls of action
// k to the context: tokens and messages.
func (g *gen) appendObservations(t *traj, k, calls int, sn snippet) {
	cfg := &g.cfg
	t.tok = g.appendTok(t.tok, tokNewline)
	t.tok = g.appendTok(t.tok, tokImStart)
	t.tok = g.appendTok(t.tok, tokUser)
	t.tok = g.appendTok(t.tok, tokNewline)
	for c := range calls {
		t.tok = g.appendTok(t.tok, tokToolResp)
		n := 8 + g.r.IntN(120)
		if cfg.ObservationLen > 0 {
			n = g.observationLen()
		}
		if g.text != nil && len(t.obs) > 0 && g.r.Float64() < repeatObservation {
			// The same output again: a file opened again, tests run again.
			o := t.obs[g.r.IntN(len(t.obs))]
			n = bytes.Count(t.tok[o[0]:o[1]], []byte{','})
			t.tok = append(t.tok, t.tok[o[0]:o[1]]...)
		} else {
			beg := len(t.tok)
			t.tok = g.appendToks(t.tok, n)
			t.obs = append(t.obs, [2]int{beg, len(t.tok)})
		}
		t.tok = g.appendTok(t.tok, tokToolRespEnd)
		if cfg.Messages {
			m := t.msgs
			m = append(m, `{"role":"tool","tool_call_id":"call_`...)
			m = appendCallID(m, k, c)
			m = append(m, `","content":"`...)
			m = append(m, sn.output...)
			if cfg.ObservationLen > 0 {
				// A long observation reads like one: the snippet's
				// output, then text the size of its tokens.
				m = append(m, `\n`...)
				m = appendWords(m, g.r, max(1, int(float64(n)*wordsPerToken)))
			}
			m = append(m, `"},`...)
			t.msgs = m
		}
	}
	t.tok = g.appendTok(t.tok, tokImEnd)
	t.tok = g.appendTok(t.tok, tokNewline)
	t.tok = g.appendTok(t.tok, tokImStart)
	t.tok = g.appendTok(t.tok, tokAssistant)
	t.tok = g.appendTok(t.tok, tokNewline)
}

// appendReset appends a fresh context at the end of t.tok and t.msgs: the
// task's system and user turns, then a user turn summarising the work so
// far, then the assistant's header.
func (g *gen) appendReset(t *traj) {
	gr := t.g
	head := gr.promptTok
	for cut := 0; cut < 3; cut++ { // drop the assistant header (3 tokens)
		head = head[:len(head)-1]
		head = head[:bytes.LastIndexByte(head, ',')+1]
	}
	n := g.vary(max(64, g.cfg.PromptLen/2), 0.5)
	t.tok = append(t.tok, head...)
	t.tok = g.appendTok(t.tok, tokImStart)
	t.tok = g.appendTok(t.tok, tokUser)
	t.tok = g.appendTok(t.tok, tokNewline)
	t.tok = g.appendToks(t.tok, n)
	t.tok = g.appendTok(t.tok, tokImEnd)
	t.tok = g.appendTok(t.tok, tokNewline)
	t.tok = g.appendTok(t.tok, tokImStart)
	t.tok = g.appendTok(t.tok, tokAssistant)
	t.tok = g.appendTok(t.tok, tokNewline)
	if g.cfg.Messages {
		m := append(t.msgs, gr.promptMsgs...)
		m = append(m, `{"role":"user","content":"Summary of the work so far: `...)
		m = appendWords(m, g.r, max(1, int(float64(n)*wordsPerToken)))
		m = append(m, `"},`...)
		t.msgs = m
	}
}

// observationLen draws an observation length: lognormal around
// ObservationLen (sigma 1: most are short, some are whole files).
func (g *gen) observationLen() int {
	const sigma = 1.0
	mean := float64(g.cfg.ObservationLen)
	n := math.Exp(math.Log(mean) - sigma*sigma/2 + sigma*g.r.NormFloat64())
	return int(min(max(n, 4), 16*mean))
}

// appendCallID appends the id of call c of action k: k+1 for the first
// call, k+1_c for parallel ones.
func appendCallID(b []byte, k, c int) []byte {
	b = strconv.AppendInt(b, int64(k+1), 10)
	if c > 0 {
		b = append(b, '_')
		b = strconv.AppendInt(b, int64(c), 10)
	}
	return b
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// trimTokens keeps only the first n comma-terminated tokens after from.
func (g *gen) trimTokens(b []byte, from, n int) []byte {
	i := from
	for c := 0; c < n; c++ {
		for b[i] != ',' {
			i++
		}
		i++
	}
	return b[:i]
}

// appendStep renders step record k of t.
func (g *gen) appendStep(b []byte, t *traj, k int) []byte {
	cfg := &g.cfg
	gr := t.g
	b = append(b, `{"type":"step","step_id":"`...)
	b = append(b, t.idBody...)
	b = append(b, '#')
	b = strconv.AppendInt(b, int64(k), 10)
	b = append(b, `","task_id":`...)
	b = append(b, gr.qTaskID...)
	if g.r.IntN(20) == 0 {
		b = append(b, `,"group_id":`...)
		b = append(b, gr.qGroupKey...)
	}
	if gr.qRole != nil {
		b = append(b, `,"role":`...)
		b = append(b, gr.qRole...)
	}
	b = append(b, `,"trajectory_id":"`...)
	b = append(b, t.idBody...)
	b = append(b, `","step_index":`...)
	b = strconv.AppendInt(b, int64(k), 10)
	b = append(b, `,"policy_version":`...)
	v := t.version[k]
	b = strconv.AppendInt(b, int64(v), 10)
	b = append(b, `,"model":"Qwen/Qwen3-8B","created_at":"`...)
	b = time.UnixMicro(t.created[k]).UTC().AppendFormat(b, "2006-01-02T15:04:05.000000Z07:00")
	b = append(b, `","finish_reason":"`...)
	b = append(b, finishNames[t.finish[k]]...)
	b = append(b, '"')
	last := k == t.n-1
	if gr.stepReward {
		b = append(b, `,"reward":`...)
		if last {
			b = strconv.AppendFloat(b, t.reward, 'g', -1, 64)
		} else {
			b = append(b, '0')
		}
	}
	if last {
		b = append(b, `,"done":true`...)
	}
	if cfg.WireDeltas && k > 0 && t.promptBeg[k] == t.promptBeg[k-1] {
		// The prompt extends the previous step's prompt and response:
		// send the tokens after them.
		b = append(b, `,"parent_step_id":"`...)
		b = append(b, t.idBody...)
		b = append(b, '#')
		b = strconv.AppendInt(b, int64(k-1), 10)
		b = append(b, `","prompt_delta_ids":[`...)
		if d := t.tok[t.respEnd[k-1]:t.promptEnd[k]]; len(d) > 0 {
			b = append(b, d[:len(d)-1]...)
		}
	} else {
		b = append(b, `,"prompt_ids":[`...)
		b = append(b, t.tok[t.promptBeg[k]:t.promptEnd[k]-1]...)
	}
	b = append(b, `],"response_ids":[`...)
	b = append(b, t.tok[t.promptEnd[k]:t.respEnd[k]-1]...)
	rl := t.respN[k]
	b = append(b, `],"response_logprobs":[`...)
	b = g.appendLogprobs(b, rl)
	b = append(b, ']')
	if split := t.tvSplit[k]; split > 0 {
		b = append(b, `,"token_versions":[`...)
		var pv, cv [24]byte
		p := append(strconv.AppendInt(pv[:0], int64(v-1), 10), ',')
		c := append(strconv.AppendInt(cv[:0], int64(v), 10), ',')
		for i := 0; i < split; i++ {
			b = append(b, p...)
		}
		for i := split; i < rl; i++ {
			b = append(b, c...)
		}
		b[len(b)-1] = ']'
	}
	if cfg.Teacher {
		b = append(b, `,"teacher_logprobs":[`...)
		b = g.appendLogprobs(b, rl)
		b = append(b, ']')
	}
	if cfg.Messages {
		if cfg.WireDeltas && k > 0 && t.promptBeg[k] == t.promptBeg[k-1] {
			// The messages after the previous step's (its answer last).
			b = append(b, `,"messages_added":[`...)
			b = append(b, t.msgs[t.msgEnd[k-1]+1:t.msgEnd[k]]...)
		} else {
			b = append(b, `,"messages":[`...)
			b = append(b, t.msgs[t.msgBeg[k]:t.msgEnd[k]]...)
		}
		b = append(b, ']')
	}
	if g.r.IntN(5) == 0 {
		b = append(b, `,"metadata":{"engine":"vllm","replica":`...)
		b = strconv.AppendInt(b, int64(g.r.IntN(64)), 10)
		b = append(b, `,"latency_ms":`...)
		b = strconv.AppendInt(b, int64(t.latency[k]), 10)
		b = append(b, '}')
	}
	return append(b, "}\n"...)
}

// appendLogprobs appends n comma-separated negative log-probabilities with
// six significant digits, most of them close to zero as in real samples.
// One 64-bit draw yields two values.
func (g *gen) appendLogprobs(b []byte, n int) []byte {
	var x uint64
	for i := 0; i < n; i++ {
		if i&1 == 0 {
			x = g.r.Uint64()
			if i > 0 {
				b = append(b, ',')
			}
		} else {
			x >>= 32
			b = append(b, ',')
		}
		b = appendLogprob(b, uint32(x))
	}
	return b
}

// appendLogprob renders one log-probability from 32 random bits: the top 8
// pick the decade, the low 24 the six-digit mantissa.
func appendLogprob(b []byte, x uint32) []byte {
	c := byte(x >> 24)
	m := uint32(uint64(x&0xffffff)*900000>>24) + 100000
	hi, mid, lo := m/10000, m/100%100, m%100
	switch {
	case c < 51: // [1e-5, 1e-4)
		b = append(b, "-0.0000"...)
	case c < 102: // [1e-4, 1e-3)
		b = append(b, "-0.000"...)
	case c < 153: // [1e-3, 1e-2)
		b = append(b, "-0.00"...)
	case c < 199: // [1e-2, 0.1)
		b = append(b, "-0.0"...)
	case c < 237: // [0.1, 1)
		b = append(b, "-0."...)
	default: // [1, 10)
		return append(b, '-', digitPairs[2*hi], '.', digitPairs[2*hi+1],
			digitPairs[2*mid], digitPairs[2*mid+1], digitPairs[2*lo], digitPairs[2*lo+1])
	}
	return append(b, digitPairs[2*hi], digitPairs[2*hi+1],
		digitPairs[2*mid], digitPairs[2*mid+1], digitPairs[2*lo], digitPairs[2*lo+1])
}

// appendTrajectory renders the trajectory record of t.
func (g *gen) appendTrajectory(b []byte, t *traj) []byte {
	gr := t.g
	b = append(b, `{"type":"trajectory","trajectory_id":"`...)
	b = append(b, t.idBody...)
	b = append(b, `","task_id":`...)
	b = append(b, gr.qTaskID...)
	if g.r.IntN(20) == 0 {
		b = append(b, `,"group_id":`...)
		b = append(b, gr.qGroupKey...)
	}
	if gr.qRole != nil {
		b = append(b, `,"role":`...)
		b = append(b, gr.qRole...)
	}
	b = append(b, `,"reward":`...)
	b = strconv.AppendFloat(b, t.reward, 'g', -1, 64)
	b = append(b, `,"num_steps":`...)
	b = strconv.AppendInt(b, int64(t.n), 10)
	b = append(b, `,"termination_reason":"`...)
	b = append(b, termNames[t.term]...)
	b = append(b, `","is_correct":`...)
	b = strconv.AppendBool(b, t.correct)
	if g.r.IntN(5) != 0 {
		b = append(b, `,"group_size":`...)
		b = strconv.AppendInt(b, int64(g.cfg.GroupSize), 10)
	}
	if g.r.IntN(10) != 0 {
		b = append(b, `,"signals":{"accuracy":`...)
		if t.correct {
			b = append(b, '1')
		} else {
			b = append(b, '0')
		}
		b = append(b, `,"format":`...)
		if t.reward > 0 || g.r.IntN(2) == 0 {
			b = append(b, '1')
		} else {
			b = append(b, '0')
		}
		b = append(b, `,"num_tool_calls":`...)
		b = strconv.AppendInt(b, int64(t.n-1), 10)
		b = append(b, '}')
	}
	if g.r.IntN(2) == 0 {
		b = append(b, `,"metadata":{"dataset":"`...)
		b = append(b, gr.dataset...)
		b = append(b, `","env":"`...)
		b = append(b, gr.env...)
		b = append(b, `","rollout":`...)
		b = strconv.AppendInt(b, int64(t.rollout), 10)
		b = append(b, '}')
	}
	return append(b, "}\n"...)
}
