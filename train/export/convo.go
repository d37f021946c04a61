package export

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
)

// message is one OpenAI chat message, decoded generically (unknown keys
// are kept), with its canonical text for comparisons.
type message struct {
	v     map[string]any
	canon string
}

// parseMessages decodes a step's messages (a JSON array of objects).
func parseMessages(raw []byte) ([]message, error) {
	var arr []json.RawMessage
	if err := json.Unmarshal(raw, &arr); err != nil {
		return nil, fmt.Errorf("messages: %w", err)
	}
	out := make([]message, 0, len(arr))
	for i, r := range arr {
		d := json.NewDecoder(bytes.NewReader(r))
		d.UseNumber()
		var m map[string]any
		if err := d.Decode(&m); err != nil || m == nil {
			return nil, fmt.Errorf("message %d is not an object", i)
		}
		canon, _ := json.Marshal(m) // map keys sorted: a canonical form
		out = append(out, message{v: m, canon: string(canon)})
	}
	return out, nil
}

// extends reports whether next starts with every message of conv.
func extends(next, conv []message) bool {
	if len(next) < len(conv) {
		return false
	}
	for i := range conv {
		if next[i].canon != conv[i].canon {
			return false
		}
	}
	return true
}

// conversations assembles a trajectory's conversations from its steps'
// messages, in step order. In the usual agent loop every call's messages
// extend the previous call's (history, tool results, the new reply): the
// trajectory is one conversation, the last step's messages. A step whose
// messages do not extend the conversation so far (a context reset, a
// summarised history) starts another one, so every conversation is one
// the model actually saw.
func conversations(steps [][]message) [][]message {
	var out [][]message
	var conv []message
	for _, m := range steps {
		if len(m) == 0 {
			continue
		}
		if conv != nil && !extends(m, conv) {
			out = append(out, conv)
		}
		conv = m
	}
	if conv != nil {
		out = append(out, conv)
	}
	return out
}

// usesTools reports whether the conversation calls tools.
func usesTools(conv []message) bool {
	for _, m := range conv {
		if m.v["role"] == "tool" {
			return true
		}
		if tc, ok := m.v["tool_calls"].([]any); ok && len(tc) > 0 {
			return true
		}
	}
	return false
}

// toolSchemas returns the tools of a conversation: those a step's metadata
// declared ({"tools": [...]}, the OpenAI request's tools), else one
// function schema per tool the conversation called, its parameters
// inferred from the arguments used (names and JSON types; all required).
func toolSchemas(conv []message, declared []any) []any {
	if len(declared) > 0 {
		return declared
	}
	type fn struct {
		props map[string]string
	}
	fns := map[string]*fn{}
	var order []string
	for _, m := range conv {
		calls, _ := m.v["tool_calls"].([]any)
		for _, c := range calls {
			cm, _ := c.(map[string]any)
			f, _ := cm["function"].(map[string]any)
			name, _ := f["name"].(string)
			if name == "" {
				continue
			}
			if fns[name] == nil {
				fns[name] = &fn{props: map[string]string{}}
				order = append(order, name)
			}
			args := map[string]any{}
			if s, ok := f["arguments"].(string); ok {
				d := json.NewDecoder(bytes.NewReader([]byte(s)))
				d.UseNumber()
				_ = d.Decode(&args)
			}
			for k, v := range args {
				fns[name].props[k] = jsonType(v)
			}
		}
	}
	tools := make([]any, 0, len(order))
	for _, name := range order {
		props := map[string]any{}
		var required []any
		keys := make([]string, 0, len(fns[name].props))
		for k := range fns[name].props {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			props[k] = map[string]any{"type": fns[name].props[k]}
			required = append(required, k)
		}
		params := map[string]any{"type": "object", "properties": props}
		if len(required) > 0 {
			params["required"] = required
		}
		tools = append(tools, map[string]any{"type": "function", "function": map[string]any{"name": name, "parameters": params}})
	}
	return tools
}

// jsonType names v's JSON Schema type.
func jsonType(v any) string {
	switch x := v.(type) {
	case string:
		return "string"
	case bool:
		return "boolean"
	case json.Number:
		if _, err := x.Int64(); err == nil {
			return "integer"
		}
		return "number"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	default:
		return "null"
	}
}

// splitCompletion cuts a conversation into prompt and completion: the
// completion is the trailing run of assistant messages. ok is false when
// the conversation does not end with an assistant message.
func splitCompletion(conv []message) (prompt, completion []message, ok bool) {
	i := len(conv)
	for i > 0 && conv[i-1].v["role"] == "assistant" {
		i--
	}
	if i == len(conv) || i == 0 {
		return nil, nil, false
	}
	return conv[:i], conv[i:], true
}

func values(ms []message) []any {
	out := make([]any, len(ms))
	for i, m := range ms {
		out[i] = m.v
	}
	return out
}
