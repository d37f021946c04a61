package export

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// memShards serves shards written in memory, in manifest order.
type memShards struct {
	entries []schemas.ShardEntry
	data    map[string][]byte
}

func (m *memShards) Committed(context.Context) ([]schemas.ShardEntry, error) { return m.entries, nil }

func (m *memShards) ReadShard(ctx context.Context, e schemas.ShardEntry, columns []string, mem memory.Allocator) (*parquet.Reader, error) {
	return parquet.Open(ctx, e.Path, bytes.NewReader(m.data[e.Path]), columns, mem)
}

// sftRowSchema holds the columns SFT reads.
var sftRowSchema = arrow.NewSchema([]arrow.Field{
	{Name: "task_id", Type: arrow.BinaryTypes.String},
	{Name: "group_id", Type: arrow.BinaryTypes.String},
	{Name: "trajectory_id", Type: arrow.BinaryTypes.String},
	{Name: "step_index", Type: arrow.PrimitiveTypes.Int32},
	{Name: "reward", Type: arrow.PrimitiveTypes.Float64},
	{Name: "filter_reason", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: "messages", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: "metadata", Type: arrow.BinaryTypes.String, Nullable: true},
}, nil)

// add writes a shard of rows (JSON objects of sftRowSchema's columns).
func (m *memShards) add(t *testing.T, rows ...string) {
	t.Helper()
	mem := memory.NewCheckedAllocator(memory.DefaultAllocator)
	defer mem.AssertSize(t, 0)
	rec, _, err := array.RecordFromJSON(mem, sftRowSchema, strings.NewReader("["+strings.Join(rows, ",")+"]"))
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Release()
	m.write(t, rec)
}

// write adds rec to m as a shard of its own.
func (m *memShards) write(t *testing.T, rec arrow.RecordBatch) {
	t.Helper()
	var buf bytes.Buffer
	w, err := parquet.NewWriter(&buf, rec.Schema(), parquet.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(rec); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	path := fmt.Sprintf("policy=0/shard-%d.parquet", len(m.entries))
	if m.data == nil {
		m.data = map[string][]byte{}
	}
	m.data[path] = buf.Bytes()
	m.entries = append(m.entries, schemas.ShardEntry{Path: path, Rows: rec.NumRows(), Bytes: int64(buf.Len())})
}

type memRows struct{ rows []string }

func (r *memRows) Write(row map[string]any) error {
	b, err := json.Marshal(row)
	r.rows = append(r.rows, string(b))
	return err
}
func (r *memRows) Close() error { return nil }

func stepRow(task, traj string, index int, reward float64, filter, messages, metadata string) string {
	opt := func(s string) string {
		if s == "" {
			return "null"
		}
		b, _ := json.Marshal(s)
		return string(b)
	}
	return fmt.Sprintf(`{"task_id":%q,"group_id":"g-%s","trajectory_id":%q,"step_index":%d,"reward":%v,"filter_reason":%s,"messages":%s,"metadata":%s}`,
		task, task, traj, index, reward, opt(filter), opt(messages), opt(metadata))
}

// TestSFT chooses trajectories (filtered ones out, a reward floor, the
// best N of a task with ties to the smaller id), merges a trajectory's
// steps in step order into its conversations, reads steps of one
// trajectory from rows in any order, counts what it leaves out, writes
// declared tools, and drops repeated rows when asked.
func TestSFT(t *testing.T) {
	u1, a1 := `{"role":"user","content":"q1"}`, `{"role":"assistant","content":"a1"}`
	u2, a2 := `{"role":"user","content":"q2"}`, `{"role":"assistant","content":"a2"}`
	call := `{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"calc","arguments":"{}"}}]}`
	res := `{"role":"tool","tool_call_id":"c1","content":"4"}`
	tools := `{"tools":[{"type":"function","function":{"name":"calc","parameters":{"type":"object"}}}]}`
	src := &memShards{}
	src.add(t,
		// t1: two steps, the second first in the shard: one conversation.
		stepRow("A", "t1", 1, 1, "", "["+u1+","+a1+","+u2+","+a2+"]", ""),
		stepRow("A", "t1", 0, 1, "", "["+u1+","+a1+"]", ""),
		// t2: same reward as t1, larger id: best-of-1 keeps t1.
		stepRow("A", "t2", 0, 1, "", "["+u1+","+a1+"]", ""),
		// t3: filtered.
		stepRow("A", "t3", 0, 1, "zero_variance", "["+u1+","+a1+"]", ""),
		// t4: under the reward floor.
		stepRow("B", "t4", 0, 0.2, "", "["+u1+","+a1+"]", ""),
	)
	src.add(t,
		// t5: tool use, its tools declared in the metadata.
		stepRow("C", "t5", 0, 0.9, "", "["+u1+","+call+","+res+","+a1+"]", tools),
		// t6: no messages at all.
		stepRow("D", "t6", 0, 0.9, "", "", ""),
		// t7: the same conversation as t1 (another task): a duplicate.
		stepRow("E", "t7", 0, 0.9, "", "["+u1+","+a1+","+u2+","+a2+"]", ""),
	)
	floor := 0.5
	out := &memRows{}
	st, err := SFT(context.Background(), src, SFTConfig{MinReward: &floor, BestOfN: 1, Dedupe: true, WithIDs: true}, out)
	if err != nil {
		t.Fatal(err)
	}
	want := SFTStats{Shards: 2, Trajectories: 7, SkippedFiltered: 1, SkippedReward: 1, SkippedBestOfN: 1, Chosen: 4,
		NoMessages: 1, Duplicates: 1, Rows: 2, RowsWithTools: 1}
	if st != want {
		t.Errorf("stats %+v\nwant  %+v", st, want)
	}
	if len(out.rows) != 2 {
		t.Fatalf("rows %q", out.rows)
	}
	var first, second map[string]any
	_ = json.Unmarshal([]byte(out.rows[0]), &first)
	_ = json.Unmarshal([]byte(out.rows[1]), &second)
	if first["trajectory_id"] != "t1" || len(first["messages"].([]any)) != 4 || first["tools"] != nil {
		t.Errorf("first row %s: want t1's four messages, no tools", out.rows[0])
	}
	if second["trajectory_id"] != "t5" || second["tools"] == nil || second["reward"] != 0.9 {
		t.Errorf("second row %s: want t5 with its declared tools", out.rows[1])
	}

	// prompt-completion: the last assistant turn is the completion.
	out = &memRows{}
	if _, err := SFT(context.Background(), src, SFTConfig{MinReward: &floor, BestOfN: 1, Format: FormatPromptCompletion}, out); err != nil {
		t.Fatal(err)
	}
	var pc map[string]any
	_ = json.Unmarshal([]byte(out.rows[0]), &pc)
	if p, c := pc["prompt"].([]any), pc["completion"].([]any); len(p) != 3 || len(c) != 1 {
		t.Errorf("prompt-completion row %s: want 3 prompt messages and 1 completion", out.rows[0])
	}
}
