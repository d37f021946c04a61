package gateway

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/ingest"
)

// FuzzCapture feeds arbitrary bodies and SSE payload sequences (one per
// line) to the response parsers, then builds the step. Invariants: no
// panic; the step line is JSON; a step judged trainable is one ingest does
// not reject for a missing field or a length mismatch; one judged not
// trainable is rejected by ingest; the stripped chunk is still JSON.
func FuzzCapture(f *testing.F) {
	fx := fixtures(f)
	for _, name := range sortedNames(fx) {
		x := fx[name]
		if x.Streaming() {
			f.Add([]byte(strings.Join(x.SSEData, "\n")), true)
		} else {
			f.Add([]byte(x.Response), false)
		}
	}
	f.Add([]byte(`{"choices":[{"index":0,"token_ids":[1,2],"logprobs":{"content":[null,{"logprob":-1}]}}],"prompt_token_ids":[]}`), false)
	f.Add([]byte(`{"choices":[{"index":0,"token_ids":[1],"logprobs":{"token_logprobs":[1e400]}}],"prompt_token_ids":[3]}`), false)
	f.Add([]byte(`{"meta_info":{"output_token_logprobs":[[-1,5],[null,6,"x"],[]]}}`), false)
	f.Fuzz(func(t *testing.T, data []byte, stream bool) {
		sess := newSession("fz:0", "r.1", time.Unix(0, 0), nil, nil, identity{}, 0)
		cl := &call{sess: sess, endpoint: "chat", stream: stream, dispatch: time.Unix(1, 0), messages: json.RawMessage(`[]`)}
		if stream {
			for _, p := range bytes.Split(data, []byte{'\n'}) {
				if string(p) == "[DONE]" || len(p) == 0 {
					continue
				}
				if cl.cap.addChunk(p) {
					if out, _, err := stripFields(p, []string{"prompt_token_ids", "weight_version"}, []string{"token_ids", "logprobs"}); err == nil && !json.Valid(out) {
						t.Fatalf("stripped chunk is not JSON: %s", out)
					}
				}
			}
		} else {
			parseResponse(data, &cl.cap)
		}
		line, tr, reject, _ := buildStep(cl, 0, nil, false)
		if !json.Valid(line) || !json.Valid(tr.json) {
			t.Fatalf("invalid JSON: %s", line)
		}
		var d ingest.Decoder
		_, err := d.Decode(line)
		reason := ""
		if err != nil {
			reason = reasonOf(err)
		}
		switch reject {
		case "":
			if reason == "missing_field" || reason == "length_mismatch" || reason == "malformed_json" || reason == "wrong_type" {
				t.Fatalf("step judged trainable, ingest says %v: %s", err, line)
			}
		default:
			if reason == "" {
				t.Fatalf("step judged %s, ingest accepts it: %s", reject, line)
			}
		}
	})
}

// FuzzSplitObject: splitting and joining an object keeps its value.
func FuzzSplitObject(f *testing.F) {
	f.Add([]byte(`{"a":1,"b":[1,2,{"c":null}],"d":"x\u00e9"}`))
	f.Add([]byte(`{"a":1,"a":2}`))
	f.Add([]byte(` { } `))
	f.Fuzz(func(t *testing.T, data []byte) {
		fs, err := splitObject(data)
		if err != nil {
			return
		}
		out := joinObject(fs)
		if !json.Valid(out) {
			t.Fatalf("joined object is not JSON: %s", out)
		}
		if json.Valid(data) && !jsonEqual(data, out) {
			t.Fatalf("value changed: %s → %s", data, out)
		}
	})
}
