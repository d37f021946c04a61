package export

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
)

func mustMessages(t *testing.T, s string) []message {
	t.Helper()
	m, err := parseMessages([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestConversations(t *testing.T) {
	u := `{"role":"user","content":"q"}`
	a := `{"role":"assistant","content":"a"}`
	// Key order and spacing do not matter: messages compare canonically.
	a2 := `{ "content":"a", "role":"assistant"}`
	tool := `{"role":"tool","content":"r"}`
	for _, tc := range []struct {
		name  string
		steps []string
		want  []int // message count of each conversation
	}{
		{"one call", []string{"[" + u + "," + a + "]"}, []int{2}},
		{"each call extends the last", []string{"[" + u + "," + a + "]", "[" + u + "," + a2 + "," + tool + "," + a + "]"}, []int{4}},
		{"a reset starts another", []string{"[" + u + "," + a + "]", "[" + tool + "," + a + "]"}, []int{2, 2}},
		{"steps without messages are skipped", []string{"[]", "[" + u + "," + a + "]"}, []int{2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var steps [][]message
			for _, s := range tc.steps {
				steps = append(steps, mustMessages(t, s))
			}
			var got []int
			for _, c := range conversations(steps) {
				got = append(got, len(c))
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("conversation lengths %v, want %v", got, tc.want)
			}
		})
	}
	if _, err := parseMessages([]byte(`[1,2]`)); err == nil {
		t.Error("messages that are not objects were accepted")
	}
}

// The Parquet schema is inferred over all rows, as a JSON loader would.
func TestParquetRowsInferSchema(t *testing.T) {
	rows := []string{
		`{"messages":[{"role":"user","content":"hi"}],"n":1,"x":1}`,
		`{"messages":[{"role":"assistant","content":[{"type":"text","text":"yo"}],"tool_calls":[{"id":"c"}]}],"n":2.5,"x":"one"}`,
		`{"messages":[],"n":null}`,
	}
	path := filepath.Join(t.TempDir(), "out.parquet")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewParquetRows(f, []string{"messages"})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		d := json.NewDecoder(bytes.NewReader([]byte(r)))
		d.UseNumber()
		var m map[string]any
		if err := d.Decode(&m); err != nil {
			t.Fatal(err)
		}
		if err := w.Write(m); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var got []string
	var schema *arrow.Schema
	err = parquet.ReadFile(context.Background(), path, nil, memory.DefaultAllocator, func(rec arrow.RecordBatch) error {
		schema = rec.Schema()
		for i := 0; i < int(rec.NumRows()); i++ {
			row := map[string]any{}
			for c, fld := range rec.Schema().Fields() {
				row[fld.Name] = rec.Column(c).GetOneForMarshal(i)
			}
			data, _ := json.Marshal(row)
			got = append(got, string(data))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	wantSchema := "messages: list<element: struct<content: utf8 nullable, role: utf8 nullable, tool_calls: list<element: struct<id: utf8 nullable>, nullable> nullable>, nullable>, n: float64, x: utf8"
	if s := schemaString(schema); s != wantSchema {
		t.Errorf("schema\n%s\nwant\n%s", s, wantSchema)
	}
	want := []string{
		`{"messages":[{"content":"hi","role":"user","tool_calls":null}],"n":1,"x":"1"}`,
		`{"messages":[{"content":"[{\"text\":\"yo\",\"type\":\"text\"}]","role":"assistant","tool_calls":[{"id":"c"}]}],"n":2.5,"x":"one"}`,
		`{"messages":[],"n":null,"x":null}`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("rows\n%q\nwant\n%q", got, want)
	}
}

func schemaString(s *arrow.Schema) string {
	var b bytes.Buffer
	for i, f := range s.Fields() {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(f.Name + ": " + f.Type.String())
	}
	return b.String()
}
