package gateway

import (
	"bytes"
	"encoding/json"
	"math"
	"sort"
	"strconv"
	"strings"
)

// capture is what one upstream call yielded for its step: choice 0's token
// ids and logprobs (nulls noted, never filled in), the assistant message,
// the finish reason, usage. A nil slice is absent; an empty one present.
type capture struct {
	model        string
	promptIDs    []int64
	responseIDs  []int64
	logprobs     []float64 // the non-null entries
	lpEntries    int       // entries seen, null ones included
	nullAt       []int     // positions of null entries
	haveLogprobs bool
	message      json.RawMessage // chat: the assistant message
	finishReason string
	promptTok    int64
	complTok     int64
	choices      int  // n
	unreadable   bool // a body or chunk was not the JSON expected
	upstreamErr  bool // a stream's error event: the generation failed midway
	// weightVersion is the version the engine stamped on its response
	// (root "weight_version", as rLLM's gateway reads it); -1 when absent
	// or not a non-negative integer.
	weightVersion int64
	// logprobsMode is the engine's logprobs mode when it stamps one (root
	// "logprobs_mode": raw_logprobs, processed_logprobs, ...).
	logprobsMode string
	// versions are the policy versions of choice 0's response tokens, as
	// runs [version, count] (nil: none known; a stream adds a run only when
	// the version changes, so a call costs nothing per token): a stream's
	// chunks carry the engine's weight_version, else the gateway's own in
	// force when they arrived (gw); a non-streamed answer its
	// output_versions (SGLang, AReaL). -1: unknown (the step's version
	// fills it in).
	versions [][2]int64
	counted  int // tokens the runs cover
	// stampedFirst: the engine stamped the first token's version (a
	// chunk's weight_version, output_versions), which is then the step's.
	stampedFirst bool
	gw           func() int64

	// streaming accumulation (choice 0)
	role       string
	content    bytes.Buffer
	hasContent bool
	reasoning  map[string]*bytes.Buffer // reasoning_content / reasoning
	toolCalls  map[int]*toolCall
	sglang     bool
}

type toolCall struct {
	id, typ, name string
	args          bytes.Buffer
}

type wireResp struct {
	Model          string       `json:"model"`
	PromptTokenIDs []int64      `json:"prompt_token_ids"`
	Choices        []wireChoice `json:"choices"`
	Usage          *wireUsage   `json:"usage"`
	// SGLang native /generate
	Text      *string `json:"text"`
	OutputIDs []int64 `json:"output_ids"`
	MetaInfo  *sgMeta `json:"meta_info"`
	// An error event of a stream: vLLM's {"error": {...}}, or the flat
	// {"object": "error", ...} of older servers.
	Error  json.RawMessage `json:"error"`
	Object string          `json:"object"`
	// The weight version a rollout engine stamps on its response (absent
	// from plain vLLM): a number, or its decimal string.
	WeightVersion json.RawMessage `json:"weight_version"`
	// A version per output token (SGLang's and AReaL's output_versions).
	OutputVersions []int64 `json:"output_versions"`
	// The engine's logprobs mode, when it says (vLLM's --logprobs-mode).
	LogprobsMode string `json:"logprobs_mode"`
}

type wireUsage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

type wireChoice struct {
	Index          int             `json:"index"`
	OutputVersions []int64         `json:"output_versions"`
	Message        json.RawMessage `json:"message"`
	Delta          *wireDelta      `json:"delta"`
	FinishReason   *string         `json:"finish_reason"`
	TokenIDs       []int64         `json:"token_ids"`
	PromptTokenIDs []int64         `json:"prompt_token_ids"`
	Logprobs       *wireLogprobs   `json:"logprobs"`
}

type wireDelta struct {
	Role             string          `json:"role"`
	Content          *string         `json:"content"`
	ReasoningContent *string         `json:"reasoning_content"`
	Reasoning        *string         `json:"reasoning"`
	ToolCalls        []wireToolDelta `json:"tool_calls"`
}

type wireToolDelta struct {
	Index    int    `json:"index"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function *struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type wireLogprobs struct {
	Content       []*struct{ Logprob *float64 } `json:"content"`
	TokenLogprobs []*float64                    `json:"token_logprobs"`
}

type sgMeta struct {
	OutputTokenLogprobs [][]json.RawMessage `json:"output_token_logprobs"`
	OutputVersions      []int64             `json:"output_versions"`
	FinishReason        json.RawMessage     `json:"finish_reason"`
	PromptTokens        int64               `json:"prompt_tokens"`
	CompletionTokens    int64               `json:"completion_tokens"`
}

// setWeightVersion keeps a response's weight_version (parseVersion).
func (c *capture) setWeightVersion(raw json.RawMessage) {
	if v, ok := parseVersion(raw); ok {
		c.weightVersion = v
	}
}

// setLogprobsMode keeps an engine's logprobs mode: a short name of
// letters, digits and underscores.
func (c *capture) setLogprobsMode(m string) {
	if m == "" || len(m) > 64 || strings.IndexFunc(m, func(r rune) bool {
		return (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9') && r != '_'
	}) >= 0 {
		return
	}
	c.logprobsMode = m
}

// parseVersion reads a weight_version: a non-negative integral number up
// to 2^53 (3, 3.0, 3e0), or such a number's decimal string, blanks around
// it allowed (as rLLM's int() takes it); false when absent (every chunk of
// a plain vLLM stream) or not one.
func parseVersion(raw json.RawMessage) (int64, bool) {
	if len(raw) == 0 {
		return 0, false
	}
	v := strings.TrimSpace(string(bytes.Trim(raw, `"`)))
	if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 && n <= 1<<53 {
		return n, true
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil && f >= 0 && f <= 1<<53 && f == math.Trunc(f) && raw[0] != '"' {
		return int64(f), true // a JSON number written 3.0 or 3e0
	}
	return 0, false
}

// addVersions notes the versions of n response tokens that arrived in one
// chunk: the chunk's weight_version, else the gateway's in force now.
func (c *capture) addVersions(n int, raw json.RawMessage) {
	v, ok := parseVersion(raw)
	if !ok {
		v = -1
		if c.gw != nil {
			v = c.gw()
		}
	}
	if c.versions == nil && v < 0 {
		return
	}
	if c.counted == 0 && len(c.responseIDs) == n {
		c.stampedFirst = ok
	}
	c.addRun(-1, len(c.responseIDs)-n-c.counted) // tokens that came with no version
	c.addRun(v, n)
}

// addRun adds n tokens at version v to the runs.
func (c *capture) addRun(v int64, n int) {
	if n <= 0 {
		return
	}
	c.counted += n
	if k := len(c.versions); k > 0 && c.versions[k-1][0] == v {
		c.versions[k-1][1] += int64(n)
		return
	}
	c.versions = append(c.versions, [2]int64{v, int64(n)})
}

// setOutputVersions keeps a non-streamed answer's per-token versions when
// there is one per response token.
func (c *capture) setOutputVersions(vs []int64) {
	if len(vs) == 0 || len(vs) != len(c.responseIDs) {
		return
	}
	for _, v := range vs {
		if v < 0 || v > 1<<53 {
			return
		}
	}
	c.versions, c.counted, c.stampedFirst = nil, 0, true
	for _, v := range vs {
		c.addRun(v, 1)
	}
}

// parseResponse reads a non-streaming response body.
func parseResponse(body []byte, c *capture) {
	var r wireResp
	if err := json.Unmarshal(body, &r); err != nil {
		c.unreadable = true
		return
	}
	c.model = r.Model
	c.setWeightVersion(r.WeightVersion)
	c.setLogprobsMode(r.LogprobsMode)
	if r.Usage != nil {
		c.promptTok, c.complTok = r.Usage.PromptTokens, r.Usage.CompletionTokens
	}
	if r.MetaInfo != nil && len(r.Choices) == 0 {
		c.sglangGenerate(&r)
		return
	}
	if r.PromptTokenIDs != nil {
		c.promptIDs = r.PromptTokenIDs
	}
	c.choices = len(r.Choices)
	for i := range r.Choices {
		ch := &r.Choices[i]
		if ch.Index != 0 {
			continue
		}
		if c.promptIDs == nil {
			c.promptIDs = ch.PromptTokenIDs
		}
		c.responseIDs = ch.TokenIDs
		c.addLogprobs(ch.Logprobs)
		if ch.OutputVersions != nil {
			c.setOutputVersions(ch.OutputVersions)
		} else {
			c.setOutputVersions(r.OutputVersions)
		}
		if ch.FinishReason != nil {
			c.finishReason = *ch.FinishReason
		}
		if len(ch.Message) > 0 && !isNull(ch.Message) {
			c.message = compactMessage(ch.Message)
		}
	}
}

// sglangGenerate reads SGLang's /generate layout: output ids at the root
// and in meta_info.output_token_logprobs rows [logprob, token_id, text].
// Streamed events are cumulative, so each replaces the last.
func (c *capture) sglangGenerate(r *wireResp) {
	c.sglang = true
	m := r.MetaInfo
	c.promptTok, c.complTok = m.PromptTokens, m.CompletionTokens
	c.choices = 1
	rows := m.OutputTokenLogprobs
	ids := make([]int64, 0, len(rows))
	c.logprobs, c.nullAt, c.lpEntries, c.haveLogprobs = c.logprobs[:0], nil, 0, rows != nil
	for i, row := range rows {
		var lp *float64
		var id int64
		if len(row) >= 2 {
			_ = json.Unmarshal(row[0], &lp)
			if err := json.Unmarshal(row[1], &id); err != nil {
				c.unreadable = true
			}
		} else {
			c.unreadable = true
		}
		ids = append(ids, id)
		c.lpEntries++
		if lp == nil {
			c.nullAt = append(c.nullAt, i)
			continue
		}
		c.logprobs = append(c.logprobs, *lp)
	}
	switch {
	case r.OutputIDs != nil:
		c.responseIDs = r.OutputIDs
	case rows != nil:
		c.responseIDs = ids
	}
	if m.OutputVersions != nil {
		c.setOutputVersions(m.OutputVersions)
	} else {
		c.setOutputVersions(r.OutputVersions)
	}
	var fr struct {
		Type string `json:"type"`
	}
	if len(m.FinishReason) > 0 && json.Unmarshal(m.FinishReason, &fr) == nil && fr.Type != "" {
		c.finishReason = fr.Type
	}
	if r.Text != nil {
		c.content.Reset()
		c.content.WriteString(*r.Text)
		c.hasContent = true
	}
}

func (c *capture) addLogprobs(lp *wireLogprobs) {
	if lp == nil {
		return
	}
	c.haveLogprobs = true
	if lp.Content != nil {
		for _, e := range lp.Content {
			if e == nil || e.Logprob == nil {
				c.nullAt = append(c.nullAt, c.lpEntries)
			} else {
				c.logprobs = append(c.logprobs, *e.Logprob)
			}
			c.lpEntries++
		}
		return
	}
	for _, v := range lp.TokenLogprobs {
		if v == nil {
			c.nullAt = append(c.nullAt, c.lpEntries)
		} else {
			c.logprobs = append(c.logprobs, *v)
		}
		c.lpEntries++
	}
}

// addChunk folds one SSE data payload into the capture. It returns false
// when the payload is not a JSON object of the shapes known.
func (c *capture) addChunk(data []byte) bool {
	var r wireResp
	if err := json.Unmarshal(data, &r); err != nil {
		c.unreadable = true
		return false
	}
	if c.model == "" {
		c.model = r.Model
	}
	if c.weightVersion < 0 {
		c.setWeightVersion(r.WeightVersion)
	}
	c.setLogprobsMode(r.LogprobsMode)
	if (len(r.Error) > 0 && string(r.Error) != "null") || r.Object == "error" {
		c.upstreamErr = true // the generation failed: what arrived is cut short
		return true
	}
	if r.Usage != nil {
		c.promptTok, c.complTok = r.Usage.PromptTokens, r.Usage.CompletionTokens
	}
	if r.MetaInfo != nil && len(r.Choices) == 0 {
		c.sglangGenerate(&r)
		return true
	}
	if c.promptIDs == nil && r.PromptTokenIDs != nil {
		c.promptIDs = r.PromptTokenIDs
	}
	for i := range r.Choices {
		ch := &r.Choices[i]
		c.choices = max(c.choices, ch.Index+1)
		if ch.Index != 0 {
			continue
		}
		if c.promptIDs == nil && ch.PromptTokenIDs != nil {
			c.promptIDs = ch.PromptTokenIDs
		}
		if ch.TokenIDs != nil {
			if c.responseIDs == nil {
				c.responseIDs = []int64{}
			}
			c.responseIDs = append(c.responseIDs, ch.TokenIDs...)
			c.addVersions(len(ch.TokenIDs), r.WeightVersion)
		}
		c.addLogprobs(ch.Logprobs)
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			c.finishReason = *ch.FinishReason
		}
		if d := ch.Delta; d != nil {
			c.addDelta(d)
		}
	}
	return true
}

func (c *capture) addDelta(d *wireDelta) {
	if d.Role != "" {
		c.role = d.Role
	}
	if d.Content != nil && *d.Content != "" {
		c.content.WriteString(*d.Content)
		c.hasContent = true
	}
	for key, v := range map[string]*string{"reasoning_content": d.ReasoningContent, "reasoning": d.Reasoning} {
		if v == nil || *v == "" {
			continue
		}
		if c.reasoning == nil {
			c.reasoning = map[string]*bytes.Buffer{}
		}
		if c.reasoning[key] == nil {
			c.reasoning[key] = &bytes.Buffer{}
		}
		c.reasoning[key].WriteString(*v)
	}
	for _, td := range d.ToolCalls {
		if c.toolCalls == nil {
			c.toolCalls = map[int]*toolCall{}
		}
		tc := c.toolCalls[td.Index]
		if tc == nil {
			tc = &toolCall{}
			c.toolCalls[td.Index] = tc
		}
		if td.ID != "" {
			tc.id = td.ID
		}
		if td.Type != "" {
			tc.typ = td.Type
		}
		if td.Function != nil {
			tc.name += td.Function.Name
			tc.args.WriteString(td.Function.Arguments)
		}
	}
}

// streamMessage assembles the assistant message of a chat stream.
func (c *capture) streamMessage() json.RawMessage {
	role := c.role
	if role == "" {
		role = "assistant"
	}
	b := []byte(`{"role":`)
	b = strconv.AppendQuote(b, role)
	b = append(b, `,"content":`...)
	switch {
	case c.hasContent:
		b = appendJSONString(b, c.content.String())
	case len(c.toolCalls) > 0:
		b = append(b, "null"...)
	default:
		b = append(b, `""`...)
	}
	if len(c.reasoning) > 0 {
		keys := make([]string, 0, len(c.reasoning))
		for k := range c.reasoning {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			b = append(b, ',')
			b = strconv.AppendQuote(b, k)
			b = append(b, ':')
			b = appendJSONString(b, c.reasoning[k].String())
		}
	}
	if len(c.toolCalls) > 0 {
		idx := make([]int, 0, len(c.toolCalls))
		for i := range c.toolCalls {
			idx = append(idx, i)
		}
		sort.Ints(idx)
		b = append(b, `,"tool_calls":[`...)
		for n, i := range idx {
			tc := c.toolCalls[i]
			if n > 0 {
				b = append(b, ',')
			}
			typ := tc.typ
			if typ == "" {
				typ = "function"
			}
			b = append(b, `{"id":`...)
			b = appendJSONString(b, tc.id)
			b = append(b, `,"type":`...)
			b = appendJSONString(b, typ)
			b = append(b, `,"function":{"name":`...)
			b = appendJSONString(b, tc.name)
			b = append(b, `,"arguments":`...)
			b = appendJSONString(b, tc.args.String())
			b = append(b, `}}`...)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

func appendJSONString(b []byte, s string) []byte {
	return append(b, marshal(s)...)
}

// compactMessage drops the members of a response message that are null
// (refusal, audio, function_call, ...) or an empty tool_calls list, keeping
// role and content (null content stays: tool-call messages have it).
func compactMessage(m json.RawMessage) json.RawMessage {
	fs, err := splitObject(m)
	if err != nil {
		return m
	}
	out := fs[:0]
	for _, f := range fs {
		v := bytes.TrimSpace(f.val)
		if f.key != "role" && f.key != "content" && (isNull(v) || (f.key == "tool_calls" && string(v) == "[]")) {
			continue
		}
		out = append(out, f)
	}
	return joinObject(out)
}
