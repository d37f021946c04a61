package train

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/apache/arrow-go/v18/arrow/array"
)

// SamplingRequirement is what a trainer requires of the sampling that
// produced its rows (step metadata "sampling", as the capture gateway
// records it: the request's sampling parameters and the engine's
// logprobs_mode): key = value, numbers compared as numbers. A group with
// a step that lacks a required key or has another value is skipped and
// counted (Counters.SkippedSampling): its behaviour logprobs are not the
// ones the trainer's importance ratio assumes.
type SamplingRequirement map[string]string

// ParseSamplingRequirement parses "key=value,key=value".
func ParseSamplingRequirement(s string) (SamplingRequirement, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	req := SamplingRequirement{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" || v == "" {
			return nil, fmt.Errorf("sampling requirement %q: want key=value[,key=value...]", kv)
		}
		req[k] = v
	}
	return req, nil
}

// String is the requirement as ParseSamplingRequirement reads it.
func (r SamplingRequirement) String() string {
	keys := make([]string, 0, len(r))
	for k := range r {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = k + "=" + r[k]
	}
	return strings.Join(keys, ",")
}

// met reports whether a step's metadata (a JSON object's text, or empty)
// meets the requirement.
func (r SamplingRequirement) met(meta []byte) bool {
	if len(r) == 0 {
		return true
	}
	if !bytes.Contains(meta, []byte(`"sampling"`)) {
		return false
	}
	var m struct {
		Sampling map[string]json.RawMessage `json:"sampling"`
	}
	if json.Unmarshal(meta, &m) != nil {
		return false
	}
	for k, want := range r {
		got, ok := m.Sampling[k]
		if !ok || !sameValue(got, want) {
			return false
		}
	}
	return true
}

// sameValue compares a recorded JSON value with a required one: as
// numbers when both are, else as strings.
func sameValue(got json.RawMessage, want string) bool {
	g := strings.TrimSpace(string(got))
	if gf, err := strconv.ParseFloat(g, 64); err == nil {
		wf, err := strconv.ParseFloat(want, 64)
		return err == nil && gf == wf
	}
	var s string
	if json.Unmarshal(got, &s) == nil {
		return s == want
	}
	return g == want // true, false, null as written
}

// sampled reports whether every step of g meets the requirement.
func (f *former) sampled(g *group) bool {
	req := f.cfg.RequireSampling
	if len(req) == 0 {
		return true
	}
	for _, p := range g.parts {
		idx := p.Schema().FieldIndices("metadata")
		if len(idx) == 0 {
			return false
		}
		col, ok := p.Column(idx[0]).(*array.String)
		if !ok {
			return false
		}
		for i := range col.Len() {
			if col.IsNull(i) || !req.met([]byte(col.Value(i))) {
				return false
			}
		}
	}
	return true
}
