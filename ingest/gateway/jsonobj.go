package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
)

// field is one member of a JSON object, its value kept as received, so that
// a request or response is rewritten without reordering or reformatting
// what the gateway does not touch.
type field struct {
	key string
	val json.RawMessage
}

var errNotObject = errors.New("not a JSON object")

// splitObject returns the members of a JSON object in order.
func splitObject(b []byte) ([]field, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errNotObject
	}
	var out []field
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		out = append(out, field{key: kt.(string), val: v})
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err == nil {
		return nil, errors.New("trailing data after the object")
	}
	return out, nil
}

func joinObject(fs []field) []byte {
	n := 2
	for _, f := range fs {
		n += len(f.key) + len(f.val) + 4
	}
	b := make([]byte, 0, n)
	b = append(b, '{')
	for i, f := range fs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendQuote(b, f.key)
		b = append(b, ':')
		b = append(b, f.val...)
	}
	return append(b, '}')
}

func getField(fs []field, key string) (json.RawMessage, bool) {
	for _, f := range fs {
		if f.key == key {
			return f.val, true
		}
	}
	return nil, false
}

func setField(fs []field, key string, val json.RawMessage) []field {
	for i := range fs {
		if fs[i].key == key {
			fs[i].val = val
			return fs
		}
	}
	return append(fs, field{key: key, val: val})
}

var jsonNull = json.RawMessage("null")

func isNull(v json.RawMessage) bool {
	return len(bytes.TrimSpace(v)) == 0 || string(bytes.TrimSpace(v)) == "null"
}

// removedKeys are the engine's extras a response loses rather than set
// to null, as rLLM's gateway removes them: vLLM's token ids and the
// weight version an engine stamps. Other keys (logprobs, an OpenAI field)
// become null, their value when not requested.
var removedKeys = map[string]bool{"prompt_token_ids": true, "token_ids": true, "weight_version": true, "output_versions": true, "logprobs_mode": true}

// stripFields removes (removedKeys) or sets to null the present root keys
// and choices[i] keys of a response (or a stream chunk); changed is false
// when nothing was there.
func stripFields(body []byte, rootKeys, choiceKeys []string) (out []byte, changed bool, err error) {
	fs, err := splitObject(body)
	if err != nil {
		return nil, false, err
	}
	strip := func(fs []field, keys []string) ([]field, bool) {
		hit := false
		kept := fs[:0]
		for _, f := range fs {
			if slices.Contains(keys, f.key) && (removedKeys[f.key] || !isNull(f.val)) {
				hit = true
				if removedKeys[f.key] {
					continue
				}
				f.val = jsonNull
			}
			kept = append(kept, f)
		}
		return kept, hit
	}
	fs, changed = strip(fs, rootKeys)
	for i := range fs {
		if fs[i].key != "choices" || len(choiceKeys) == 0 || isNull(fs[i].val) {
			continue
		}
		var choices []json.RawMessage
		if err := json.Unmarshal(fs[i].val, &choices); err != nil {
			return nil, false, err
		}
		cchanged := false
		for j, c := range choices {
			cf, err := splitObject(c)
			if err != nil {
				return nil, false, err
			}
			if cf, hit := strip(cf, choiceKeys); hit {
				choices[j], cchanged = joinObject(cf), true
			}
		}
		if cchanged {
			b := []byte{'['}
			for j, c := range choices {
				if j > 0 {
					b = append(b, ',')
				}
				b = append(b, c...)
			}
			fs[i].val, changed = append(b, ']'), true
		}
	}
	if !changed {
		return body, false, nil
	}
	return joinObject(fs), true, nil
}

// splitOrEmpty is obj's fields, none when obj is empty or not an object.
func splitOrEmpty(obj json.RawMessage) []field {
	if len(obj) == 0 {
		return nil
	}
	fs, err := splitObject(obj)
	if err != nil {
		return nil
	}
	return fs
}
