package main

// End-to-end tests: they build the real rllm-pipe binary, run it as a
// subprocess on corpora, and check every committed Parquet shard with two
// independent readers (DuckDB through database/sql, and parquet-go) against
// the reference implementation in reference_test.go.

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	_ "github.com/duckdb/duckdb-go/v2"
	"github.com/parquet-go/parquet-go"

	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb"
	"github.com/rllm-pipe/rllm-pipe/connectors/local"
)

// ---------------------------------------------------------------------------
// Building and running the binary

func e2eModuleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test directory")
		}
		dir = parent
	}
}

// e2eBinary is ./cmd/rllm-pipe, built once per test run (the link, with
// DuckDB's library and under the race detector, is slow; the build cache
// does not keep it) into the directory TestMain removes.
// RLLM_PIPE_E2E_BIN may name a prebuilt binary instead. A build failure
// fails every test that needs the binary. When the tests run under the
// race detector, so does the binary: a data race in the process that does
// the work fails the test (its exit code is 66). Tests run the binary,
// never change it.
func e2eBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("RLLM_PIPE_E2E_BIN"); p != "" {
		return p
	}
	root := e2eModuleRoot(t)
	e2eBuild.once.Do(func() { e2eBuild.bin, e2eBuild.err = buildE2EBinary(root, e2eBuild.dir, "rllm-pipe") })
	if e2eBuild.err != nil {
		t.Fatal(e2eBuild.err)
	}
	return e2eBuild.bin
}

// e2eIcebergBinary is e2eBinary with rllm-pipe-iceberg built beside it
// (RLLM_PIPE_E2E_BIN's must have it beside it or on PATH).
func e2eIcebergBinary(t *testing.T) string {
	t.Helper()
	bin := e2eBinary(t)
	if os.Getenv("RLLM_PIPE_E2E_BIN") != "" {
		return bin
	}
	root := e2eModuleRoot(t)
	e2eBuild.onceIceberg.Do(func() { _, e2eBuild.icebergErr = buildE2EBinary(root, e2eBuild.dir, icebergExe) })
	if e2eBuild.icebergErr != nil {
		t.Fatal(e2eBuild.icebergErr)
	}
	return bin
}

// e2eBuild is the binaries e2eBinary and e2eIcebergBinary built, in
// e2eBuild.dir (made and removed by TestMain).
var e2eBuild struct {
	dir         string
	once        sync.Once
	bin         string
	err         error
	onceIceberg sync.Once
	icebergErr  error
}

// buildE2EBinary builds ./cmd/NAME of the module at root into dir/NAME.
func buildE2EBinary(root, dir, name string) (string, error) {
	if dir == "" {
		return "", errors.New("e2eBinary: no build directory (TestMain makes it)")
	}
	bin := filepath.Join(dir, name)
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "./cmd/"+name)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s failed: %v\n%s", name, err, out)
	}
	return bin, nil
}

// e2eEnv is the environment without RLLM_* variables (they would override
// flag defaults).
func e2eEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RLLM_") {
			env = append(env, kv)
		}
	}
	return env
}

type e2eRunResult struct {
	stdout, stderr string
	code           int
}

func e2eRun(t *testing.T, bin, dir string, args ...string) e2eRunResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = e2eEnv()
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	res := e2eRunResult{stdout: so.String(), stderr: se.String()}
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("running %s %q: %v", bin, args, err)
		}
		res.code = ee.ExitCode()
	}
	return res
}

func e2eFileURL(p string) string { return "file://" + filepath.ToSlash(p) }

// e2eIngest runs `rllm-pipe ingest` and requires exit code 0.
func e2eIngest(t *testing.T, bin, dir, in, out, stats string, extra ...string) {
	t.Helper()
	args := append([]string{"ingest", "--from", e2eFileURL(in), "--to", e2eFileURL(out), "--stats-json", stats}, extra...)
	r := e2eRun(t, bin, dir, args...)
	if r.code != 0 {
		t.Fatalf("rllm-pipe %s: exit code %d (want 0)\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, e2eClip(r.stdout, 4000), e2eClip(r.stderr, 4000))
	}
}

// ---------------------------------------------------------------------------
// Input handling

// e2eSplitLines splits file content into lines without '\n' (a final
// newline does not start a new line).
func e2eSplitLines(data []byte) [][]byte {
	if len(data) == 0 {
		return nil
	}
	parts := bytes.Split(data, []byte("\n"))
	if len(parts[len(parts)-1]) == 0 {
		parts = parts[:len(parts)-1]
	}
	return parts
}

func e2eJoinLines(lines [][]byte) []byte {
	var b bytes.Buffer
	for _, l := range lines {
		b.Write(l)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// e2eLine is one input line with the fault its author intended.
type e2eLine struct {
	raw       []byte
	hasIntent bool
	reason    string
	field     string // field the error sentence must name ("" = not checked)
	origin    string
}

var e2eExpectRE = regexp.MustCompile(`_expect\W+([a-z_]+)`)

func e2eLoadAnnotated(t *testing.T, path string) []e2eLine {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []e2eLine
	for i, raw := range e2eSplitLines(data) {
		l := e2eLine{raw: raw, origin: fmt.Sprintf("%s:%d", filepath.Base(path), i+1)}
		if m := e2eExpectRE.FindSubmatch(raw); m != nil {
			l.hasIntent, l.reason = true, string(m[1])
		}
		out = append(out, l)
	}
	return out
}

func e2eClip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + fmt.Sprintf("...(%d more bytes)", len(s)-n)
}

// stopWithin bounds how long a worker may take to stop cleanly after
// SIGTERM in the integration tests.
const stopWithin = 2 * time.Minute

// terminate sends c SIGTERM and returns its exit status from done (which
// receives c.Wait's result), within stopWithin (terminateWithin).
func terminate(t testing.TB, c *exec.Cmd, done <-chan error, stderr fmt.Stringer) error {
	t.Helper()
	return terminateWithin(t, c, done, stderr, stopWithin)
}

// terminateWithin sends c SIGTERM and returns its exit status from done.
// A process still running after within is sent SIGQUIT, so that its
// goroutines are dumped to its stderr, and the test fails with that dump:
// a hung stop is reported, never waited for until the suite's timeout.
func terminateWithin(t testing.TB, c *exec.Cmd, done <-chan error, stderr fmt.Stringer, within time.Duration) error {
	t.Helper()
	if err := c.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("SIGTERM: %w", err)
	}
	select {
	case err := <-done:
		return err
	case <-time.After(within):
	}
	c.Process.Signal(syscall.SIGQUIT)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		c.Process.Kill()
		<-done
	}
	t.Fatalf("%s did not stop within %s of SIGTERM; its goroutines (SIGQUIT):\n%s", c.Args[1], within, e2eTail(stderr.String(), 200_000))
	return nil
}

// waitChan runs c.Wait on a goroutine of its own and returns its result.
func waitChan(c *exec.Cmd) <-chan error {
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	return done
}

// watchdog sends c SIGQUIT (its goroutines go to its stderr) if it still
// runs after d, and kills it 30 s later: a hung child fails its test in
// minutes, with the dump, instead of holding the suite to its timeout.
// The returned func disarms it.
func watchdog(c *exec.Cmd, d time.Duration) func() {
	quit := time.AfterFunc(d, func() { c.Process.Signal(syscall.SIGQUIT) })
	kill := time.AfterFunc(d+30*time.Second, func() { c.Process.Kill() })
	return func() { quit.Stop(); kill.Stop() }
}

// e2eTail is the last n bytes of s.
func e2eTail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return fmt.Sprintf("(%d bytes before)...", len(s)-n) + s[len(s)-n:]
}

func e2eShort(s string) string {
	if len(s) > 80 {
		return fmt.Sprintf("%q...(len %d)", s[:60], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// ---------------------------------------------------------------------------
// Programmatic corpus parts

// e2eUTF8Lines: a complete group (group_size 2) whose records carry invalid
// UTF-8 inside strings (values, object keys, ids). They must be kept, with
// each invalid byte replaced by U+FFFD.
func e2eUTF8Lines() []e2eLine {
	lines := []string{
		"{\"type\":\"step\",\"step_id\":\"U1-s0-\xff\",\"task_id\":\"utf8-task\",\"trajectory_id\":\"U1\",\"step_index\":0,\"policy_version\":3,\"prompt_ids\":[1],\"response_ids\":[2],\"response_logprobs\":[-0.5],\"model\":\"m\xc3\x28\",\"finish_reason\":\"stop\xe2\x82\",\"messages\":[{\"role\":\"user\",\"content\":\"euro \xe2\x82\xac trunc \xe2\x82 cesu \xed\xa0\x80 overlong \xc0\xaf five \xf8\x88\x80\x80\x80 end\"}],\"metadata\":{\"k\":\"v\xfe\",\"\xff\":\"key\"},\"x_\xff\":1}",
		"{\"type\":\"trajectory\",\"trajectory_id\":\"U1\",\"task_id\":\"utf8-task\",\"reward\":1,\"num_steps\":1,\"group_size\":2,\"termination_reason\":\"t\xed\xa0\x80\",\"metadata\":{\"note\":\"caf\xe9\"}}",
		"{\"type\":\"trajectory\",\"trajectory_id\":\"U2-\xc0\xaf\",\"task_id\":\"utf8-task\",\"reward\":0.25,\"num_steps\":1,\"group_size\":2,\"termination_reason\":\"日本語 ✓\"}",
		"{\"type\":\"step\",\"step_id\":\"U2-ステップ-😀\",\"task_id\":\"utf8-task\",\"trajectory_id\":\"U2-\xc0\xaf\",\"step_index\":0,\"policy_version\":3,\"prompt_ids\":[1],\"response_ids\":[2],\"response_logprobs\":[-0.5],\"model\":\"モデル\"}",
	}
	var out []e2eLine
	for i, s := range lines {
		out = append(out, e2eLine{raw: []byte(s), origin: fmt.Sprintf("utf8[%d]", i)})
	}
	return out
}

// e2eLargeLines: a valid long-context step (about 1.5 MB on one line) in a
// group of one. The spec sets no line-length limit.
func e2eLargeLines() []e2eLine {
	var b bytes.Buffer
	b.WriteString(`{"type":"step","step_id":"LARGE-s0","task_id":"large","trajectory_id":"LARGE","step_index":0,"policy_version":6,"prompt_ids":[`)
	for i := 0; i < 200000; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa((i * 7919) % 151936))
	}
	b.WriteString(`],"response_ids":[`)
	for i := 0; i < 30000; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa((i * 104729) % 151936))
	}
	b.WriteString(`],"response_logprobs":[`)
	for i := 0; i < 30000; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatFloat(-float64(i%1000)/977, 'g', -1, 64))
	}
	b.WriteString(`]}`)
	return []e2eLine{
		{raw: []byte(`{"type":"trajectory","trajectory_id":"LARGE","task_id":"large","reward":1,"num_steps":1,"group_size":1}`), origin: "large[0]"},
		{raw: b.Bytes(), origin: "large[1]"},
	}
}

// e2eOddLines: bad lines that cannot carry an annotation or that need raw
// invalid bytes.
func e2eOddLines() []e2eLine {
	mk := func(s, reason string) e2eLine {
		return e2eLine{raw: []byte(s), hasIntent: true, reason: reason, origin: "odd"}
	}
	return []e2eLine{
		mk(`42`, refNotAnObject),
		mk(`null`, refNotAnObject),
		mk(`true`, refNotAnObject),
		mk(`NaN`, refNotAnObject),
		mk(`[]`, refNotAnObject),
		mk("{\"type\":\"step\",\"step_id\":\"\xff\xfe", refMalformedJSON),
		mk("{\"type\":\"trajectory\",\"trajectory_id\":\"odd-1\",\"task_id\":\"odd-1\",\"reward\":1,\"num_steps\":1}\xff", refMalformedJSON),
		mk("\xef\xbb\xbf{\"type\":\"trajectory\",\"trajectory_id\":\"odd-2\",\"task_id\":\"odd-2\",\"reward\":1,\"num_steps\":1}", refMalformedJSON),
		mk(`{`, refMalformedJSON),
		mk(`}`, refMalformedJSON),
		mk(`{"type":"step","step_id":"odd-3-s0","task_id":"odd-3","trajectory_id":"odd-3-t","step_index":0,"policy_version":1,"prompt_ids":[1],"response_ids":[2],"response_logprobs":[-0.5],"model":"unterminated}`, refMalformedJSON),
	}
}

type e2eKV struct{ k, v string }

func e2eQ(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func e2eStepTemplate(id string) []e2eKV {
	return []e2eKV{
		{"type", `"step"`}, {"step_id", e2eQ(id + "-s0")}, {"task_id", e2eQ(id)}, {"group_id", e2eQ("g-" + id)},
		{"role", `"r"`}, {"trajectory_id", e2eQ(id + "-t")}, {"step_index", "0"}, {"policy_version", "1"},
		{"prompt_ids", "[1,2]"}, {"response_ids", "[3,4]"}, {"response_logprobs", "[-0.5,-0.25]"},
		{"token_versions", "[1,1]"}, {"teacher_logprobs", "[-0.4,-0.3]"},
		{"messages", `[{"role":"user","content":"hi"}]`}, {"reward", "0.5"}, {"done", "false"},
		{"finish_reason", `"stop"`}, {"model", `"m"`}, {"created_at", `"2024-01-01T00:00:00Z"`}, {"metadata", `{"k":1}`},
	}
}

func e2eTrajTemplate(id string) []e2eKV {
	return []e2eKV{
		{"type", `"trajectory"`}, {"trajectory_id", e2eQ(id + "-t")}, {"task_id", e2eQ(id)}, {"group_id", e2eQ("g-" + id)},
		{"role", `"r"`}, {"reward", "0.5"}, {"num_steps", "1"}, {"termination_reason", `"done"`},
		{"signals", `{"a":1}`}, {"is_correct", "true"}, {"group_size", "2"}, {"metadata", `{"k":"v"}`},
	}
}

// e2eRender writes the template with field replaced by value (del: removed).
func e2eRender(kvs []e2eKV, field, value string, del bool) []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	first := true
	for _, kv := range kvs {
		v := kv.v
		if kv.k == field {
			if del {
				continue
			}
			v = value
		}
		if !first {
			b.WriteByte(',')
		}
		first = false
		b.WriteString(e2eQ(kv.k))
		b.WriteByte(':')
		b.WriteString(v)
	}
	b.WriteByte('}')
	return b.Bytes()
}

type e2eMutation struct {
	traj   bool
	field  string
	value  string // "" with del
	del    bool
	reason string
}

func e2eMutations() []e2eMutation {
	var ms []e2eMutation
	add := func(traj bool, field, reason string, values ...string) {
		for _, v := range values {
			ms = append(ms, e2eMutation{traj: traj, field: field, value: v, reason: reason})
		}
	}
	del := func(traj bool, field string) {
		ms = append(ms, e2eMutation{traj: traj, field: field, del: true, reason: refMissingField})
	}
	const S, T = false, true
	// type
	del(S, "type")
	add(S, "type", refMissingField, "null")
	add(S, "type", refWrongType, "1", `["step"]`, "true", "{}")
	add(S, "type", refUnknownType, `"Step"`, `""`, `"trajectory_step"`, `" step"`)
	add(T, "type", refUnknownType, `"Trajectory"`)
	// step ids
	for _, f := range []string{"step_id", "task_id", "trajectory_id"} {
		del(S, f)
		add(S, f, refMissingField, "null")
		add(S, f, refWrongType, "5", `["x"]`, "true")
		add(S, f, refInvalidValue, `""`)
	}
	add(S, "group_id", refWrongType, "5", "{}", "true")
	add(S, "role", refWrongType, "5", "[]")
	for _, f := range []string{"step_index", "policy_version"} {
		del(S, f)
		add(S, f, refMissingField, "null")
		add(S, f, refWrongType, `"0"`, "0.5", "true", "[0]", "{}", "1.000001")
		add(S, f, refInvalidValue, "-1", "-1.0", "-2e0")
	}
	for _, f := range []string{"prompt_ids", "response_ids"} {
		del(S, f)
		add(S, f, refMissingField, "null")
		add(S, f, refWrongType, `"1,2"`, `{"0":1}`, "5", `[1,"2"]`, "[1,2.5]", "[1,true]", "[[1],2]", "[1,null]")
		add(S, f, refInvalidTokenID, "[-1,2]", "[1,2147483648]", "[1,1e10]", "[-2147483648,2]", "[1,4294967297]", "[1,2.147483648e9]")
	}
	del(S, "response_logprobs")
	add(S, "response_logprobs", refMissingField, "null")
	add(S, "response_logprobs", refWrongType, `"x"`, "{}", `[-0.5,"a"]`, "[-0.5,true]", "[-0.5,null]", "[-0.5,[1]]")
	add(S, "response_logprobs", refNonFinite, "[-0.5,NaN]", "[-0.5,Infinity]", "[-Infinity,-0.25]", "[-0.5,1e999]", "[-0.5,-1e999]", "[-0.5,1e39]", "[-3.5e38,-0.25]", "[-0.5,3.4028236e38]")
	add(S, "response_logprobs", refLengthMismatch, "[-0.5]", "[-0.5,-0.25,-1]", "[]")
	add(S, "token_versions", refWrongType, `"1"`, "{}", `[1,"1"]`, "[1,1.5]", "[1,true]")
	add(S, "token_versions", refInvalidValue, "[1,-1]", "[-3,1]")
	add(S, "token_versions", refLengthMismatch, "[1]", "[1,1,1]", "[]")
	add(S, "teacher_logprobs", refWrongType, `"x"`, `[-0.4,"x"]`, "{}")
	add(S, "teacher_logprobs", refNonFinite, "[-0.4,NaN]", "[-0.4,1e39]", "[Infinity,-0.3]")
	add(S, "teacher_logprobs", refLengthMismatch, "[-0.4]", "[]", "[-0.4,-0.3,-0.2]")
	add(S, "messages", refWrongType, "{}", `"hi"`, "1", "[1]", `["x"]`, "[[]]", `[{"role":"user"},"x"]`, "[null]", "true")
	add(S, "reward", refWrongType, `"0.5"`, "true", "[0.5]", "{}")
	add(S, "reward", refNonFinite, "NaN", "Infinity", "-Infinity", "1e999", "-1e999")
	add(S, "done", refWrongType, `"true"`, "1", "0", `"false"`, "[]")
	add(S, "finish_reason", refWrongType, "1", "{}", "false")
	add(S, "model", refWrongType, "1", "[]")
	add(S, "created_at", refWrongType, "1", "{}", "true")
	add(S, "created_at", refInvalidValue, `"yesterday"`, `"2024-02-30T00:00:00Z"`, `"2024-01-01"`, `"2024-01-01T00:00:00"`, `""`, `"2024-13-01T00:00:00Z"`, `"2024-01-01T25:00:00Z"`, `"01/02/2024 10:00"`)
	add(S, "metadata", refWrongType, "[1]", `"x"`, "1", "true", "[]")
	// trajectory
	for _, f := range []string{"trajectory_id", "task_id"} {
		del(T, f)
		add(T, f, refMissingField, "null")
		add(T, f, refWrongType, "5", "true")
		add(T, f, refInvalidValue, `""`)
	}
	del(T, "reward")
	add(T, "reward", refMissingField, "null")
	add(T, "reward", refWrongType, `"1"`, "true", "[1]", "{}")
	add(T, "reward", refNonFinite, "NaN", "Infinity", "-Infinity", "1e999", "-1e400")
	del(T, "num_steps")
	add(T, "num_steps", refMissingField, "null")
	add(T, "num_steps", refWrongType, `"1"`, "1.5", "true", "[1]")
	add(T, "num_steps", refInvalidValue, "0", "-1", "0.0", "-5e0")
	add(T, "group_id", refWrongType, "5")
	add(T, "role", refWrongType, "5")
	add(T, "termination_reason", refWrongType, "1")
	add(T, "signals", refWrongType, "[1]", `"x"`, "1", "true", `{"a":"b"}`, `{"a":true}`, `{"a":[1]}`, `{"a":{}}`)
	add(T, "signals", refNonFinite, `{"a":NaN}`, `{"a":Infinity}`, `{"a":-Infinity}`, `{"a":1,"b":1e999}`)
	add(T, "is_correct", refWrongType, `"true"`, "1", "0")
	add(T, "group_size", refInvalidValue, "0", "-2", "0.0")
	add(T, "group_size", refWrongType, `"2"`, "2.5", "true")
	add(T, "metadata", refWrongType, "[]", `"x"`, "1")
	return ms
}

func e2eMutationLines() []e2eLine {
	var out []e2eLine
	for i, m := range e2eMutations() {
		id := fmt.Sprintf("mut-%03d", i)
		tmpl := e2eStepTemplate(id)
		if m.traj {
			tmpl = e2eTrajTemplate(id)
		}
		field := m.field
		if m.reason == refUnknownType {
			field = "" // the error sentence need not name "type"
		}
		out = append(out, e2eLine{
			raw: e2eRender(tmpl, m.field, m.value, m.del), hasIntent: true, reason: m.reason, field: field,
			origin: fmt.Sprintf("mutation %s.%s=%s", map[bool]string{false: "step", true: "trajectory"}[m.traj], m.field, map[bool]string{false: m.value, true: "<deleted>"}[m.del]),
		})
	}
	return out
}

// ---------------------------------------------------------------------------
// Reading the output

type e2eDLQEntry struct {
	Reason         string `json:"reason"`
	Error          string `json:"error"`
	Record         string `json:"record"`
	RecordEncoding string `json:"record_encoding"`
	Source         struct {
		File string `json:"file"`
		Line int64  `json:"line"`
	} `json:"source"`
	keys    map[string]bool
	rawLine string
	where   string
}

type e2eManifestEntry struct {
	Path string `json:"path"`
	Rows int64  `json:"rows"`
}

type e2eGotRow struct {
	file string // relative, slash-separated
	v    map[string]any
}

type e2eOutput struct {
	out       string
	committed []string // relative slash paths of committed shards
	fileRows  map[string]int64
	rows      []*e2eGotRow
	manifest  []e2eManifestEntry
	dlq       []*e2eDLQEntry
	stats     map[string]any
}

// Spec'd columns with the DuckDB types accepted for each.
var e2eColumns = []struct{ name, types string }{
	{"group_id", "VARCHAR"}, {"task_id", "VARCHAR"}, {"role", "VARCHAR"}, {"trajectory_id", "VARCHAR"},
	{"step_id", "VARCHAR"}, {"step_index", "INTEGER"}, {"num_steps", "INTEGER"}, {"policy_version", "BIGINT"},
	{"group_version", "BIGINT"}, {"prompt_ids", "INTEGER[]"}, {"response_ids", "INTEGER[]"},
	{"response_logprobs", "FLOAT[]"}, {"token_versions", "BIGINT[]"}, {"teacher_logprobs", "FLOAT[]"},
	{"messages", "VARCHAR|JSON"}, {"reward", "DOUBLE"}, {"step_reward", "DOUBLE"}, {"advantage", "DOUBLE"},
	{"group_size", "INTEGER"}, {"expected_group_size", "INTEGER"}, {"partial", "BOOLEAN"},
	{"finish_reason", "VARCHAR"}, {"termination_reason", "VARCHAR"}, {"done", "BOOLEAN"},
	{"is_correct", "BOOLEAN"}, {"model", "VARCHAR"}, {"created_at", "TIMESTAMP|TIMESTAMP WITH TIME ZONE"},
	{"metadata", "VARCHAR|JSON"}, {"trajectory_metadata", "VARCHAR|JSON"}, {"signals", "MAP(VARCHAR, DOUBLE)"},
	{"source_file", "VARCHAR"}, {"source_line", "BIGINT"},
}

func e2eSQLString(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// e2eSQLList is paths as a DuckDB list of string literals, for read_parquet.
func e2eSQLList(paths []string) string {
	quoted := make([]string, len(paths))
	for i, p := range paths {
		quoted[i] = e2eSQLString(p)
	}
	return "[" + strings.Join(quoted, ",") + "]"
}

var e2ePolicyDirRE = regexp.MustCompile(`^policy=(0|[1-9][0-9]*)/[^/]+\.parquet$`)

// e2eCommittedFiles lists every *.parquet under out whose path has no
// component starting with '_'.
func e2eCommittedFiles(t *testing.T, out string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(out, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != out && strings.HasPrefix(d.Name(), "_") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".parquet") {
			rel, _ := filepath.Rel(out, p)
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walking %s: %v", out, err)
	}
	sort.Strings(files)
	return files
}

func e2eReadOutput(t *testing.T, out, statsPath string) *e2eOutput {
	t.Helper()
	o := &e2eOutput{out: out, fileRows: map[string]int64{}}
	o.committed = e2eCommittedFiles(t, out)
	for _, f := range o.committed {
		if !e2ePolicyDirRE.MatchString(f) {
			t.Errorf("committed shard %q is not at policy=<N>/<name>.parquet", f)
		}
	}

	db, err := sql.Open("duckdb", "")
	if err != nil {
		t.Fatalf("opening duckdb: %v", err)
	}
	defer db.Close()
	typeProblems := map[string]bool{}
	for _, rel := range o.committed {
		abs := filepath.Join(out, filepath.FromSlash(rel))
		src := fmt.Sprintf("read_parquet(%s, hive_partitioning=false)", e2eSQLString(abs))
		types := map[string]string{}
		drows, err := db.Query("DESCRIBE SELECT * FROM " + src)
		if err != nil {
			t.Fatalf("DuckDB cannot read committed shard %s: %v", rel, err)
		}
		for drows.Next() {
			var name, typ string
			var n1, n2, n3, n4 any
			if err := drows.Scan(&name, &typ, &n1, &n2, &n3, &n4); err != nil {
				t.Fatalf("describe %s: %v", rel, err)
			}
			types[name] = typ
		}
		drows.Close()
		var exprs []string
		for _, c := range e2eColumns {
			typ, ok := types[c.name]
			if !ok {
				typeProblems[fmt.Sprintf("column %s is missing", c.name)] = true
			} else if !e2eTypeOK(typ, c.types) {
				typeProblems[fmt.Sprintf("column %s has DuckDB type %s, want %s", c.name, typ, c.types)] = true
			}
			switch {
			case !ok:
				if c.name == "signals" {
					exprs = append(exprs, "NULL AS signals_keys", "NULL AS signals_values", "true AS signals_null")
				} else {
					exprs = append(exprs, "NULL AS "+c.name)
				}
			case c.name == "signals":
				exprs = append(exprs, "map_keys(signals) AS signals_keys", "map_values(signals) AS signals_values", "(signals IS NULL) AS signals_null")
			case strings.Contains(c.types, "JSON"):
				exprs = append(exprs, fmt.Sprintf("CAST(%s AS VARCHAR) AS %s", c.name, c.name))
			default:
				exprs = append(exprs, c.name)
			}
		}
		// Prompts and messages stored as deltas are read back whole.
		whole := "(" + duckdb.WholePrompts("SELECT *, 'shard' AS shard FROM "+src) + ")"
		rows, err := db.Query("SELECT " + strings.Join(exprs, ", ") + " FROM " + whole)
		if err != nil {
			t.Fatalf("DuckDB query on %s: %v", rel, err)
		}
		cols, _ := rows.Columns()
		n := int64(0)
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatalf("scan %s: %v", rel, err)
			}
			r := &e2eGotRow{file: rel, v: map[string]any{}}
			for i, c := range cols {
				r.v[c] = vals[i]
			}
			o.rows = append(o.rows, r)
			n++
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("reading %s: %v", rel, err)
		}
		rows.Close()
		o.fileRows[rel] = n
	}
	for _, p := range refSortedKeys(typeProblems) {
		t.Errorf("parquet schema: %s", p)
	}

	// Manifest.
	if data, err := os.ReadFile(filepath.Join(out, "_manifest", "shards.jsonl")); err != nil {
		t.Errorf("reading manifest: %v", err)
	} else {
		for i, l := range e2eSplitLines(data) {
			if refIsBlankLine(l) {
				continue
			}
			var e e2eManifestEntry
			if err := json.Unmarshal(l, &e); err != nil {
				t.Errorf("manifest line %d is not {path, rows} JSON: %v: %s", i+1, err, e2eClip(string(l), 300))
				continue
			}
			o.manifest = append(o.manifest, e)
		}
	}

	// Dead letters.
	dlqDir := filepath.Join(out, "_dlq")
	entries, err := os.ReadDir(dlqDir)
	if err != nil && !os.IsNotExist(err) {
		t.Errorf("reading %s: %v", dlqDir, err)
	}
	for _, de := range entries {
		if de.IsDir() || !strings.HasSuffix(de.Name(), ".jsonl") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dlqDir, de.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range e2eSplitLines(data) {
			if refIsBlankLine(l) {
				continue
			}
			where := fmt.Sprintf("_dlq/%s:%d", de.Name(), i+1)
			e := &e2eDLQEntry{rawLine: string(l), where: where}
			if err := json.Unmarshal(l, e); err != nil {
				t.Errorf("%s: not a dead-letter JSON object: %v: %s", where, err, e2eClip(string(l), 300))
				continue
			}
			var keys map[string]json.RawMessage
			_ = json.Unmarshal(l, &keys)
			e.keys = map[string]bool{}
			for k := range keys {
				e.keys[k] = true
			}
			o.dlq = append(o.dlq, e)
		}
	}

	// Stats.
	if statsPath != "" {
		data, err := os.ReadFile(statsPath)
		if err != nil {
			t.Errorf("reading --stats-json output: %v", err)
		} else {
			dec := json.NewDecoder(bytes.NewReader(data))
			dec.UseNumber()
			if err := dec.Decode(&o.stats); err != nil {
				t.Errorf("stats JSON: %v: %s", err, e2eClip(string(data), 500))
			}
		}
	}
	return o
}

func e2eTypeOK(got, want string) bool {
	for _, w := range strings.Split(want, "|") {
		if got == w {
			return true
		}
	}
	return false
}

// ---------------------------------------------------------------------------
// Value conversion helpers for scanned DuckDB values

func e2eStr(v any) (*string, bool) {
	switch x := v.(type) {
	case nil:
		return nil, true
	case string:
		return &x, true
	case []byte:
		s := string(x)
		return &s, true
	}
	return nil, false
}

func e2eInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case int:
		return int64(x), true
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case uint64:
		if x <= math.MaxInt64 {
			return int64(x), true
		}
	}
	return 0, false
}

func e2eFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case float32:
		return float64(x), true
	}
	return 0, false
}

// e2eIntList: null -> (nil, true, true).
func e2eIntList(v any) (list []int64, isNull, ok bool) {
	if v == nil {
		return nil, true, true
	}
	a, ok := v.([]any)
	if !ok {
		return nil, false, false
	}
	out := make([]int64, len(a))
	for i, e := range a {
		n, ok := e2eInt(e)
		if !ok {
			return nil, false, false
		}
		out[i] = n
	}
	return out, false, true
}

func e2eFloat32List(v any) (list []float32, isNull, ok bool) {
	if v == nil {
		return nil, true, true
	}
	a, ok := v.([]any)
	if !ok {
		return nil, false, false
	}
	out := make([]float32, len(a))
	for i, e := range a {
		switch x := e.(type) {
		case float32:
			out[i] = x
		case float64:
			out[i] = float32(x)
		default:
			return nil, false, false
		}
	}
	return out, false, true
}

func e2ePtrStr(p *string) string {
	if p == nil {
		return "NULL"
	}
	return e2eShort(*p)
}

// ---------------------------------------------------------------------------
// Comparisons

// e2eCompareRow returns the differences between an expected and a read row.
func e2eCompareRow(exp *refRow, g *e2eGotRow) []string {
	var d []string
	bad := func(col string, got any, want any) {
		d = append(d, fmt.Sprintf("%s: got %v, want %v", col, got, want))
	}
	strCol := func(col string, want *string) {
		got, ok := e2eStr(g.v[col])
		if !ok {
			bad(col, fmt.Sprintf("%T", g.v[col]), "string")
			return
		}
		if (got == nil) != (want == nil) || (got != nil && *got != *want) {
			bad(col, e2ePtrStr(got), e2ePtrStr(want))
		}
	}
	intCol := func(col string, want int64) {
		got, ok := e2eInt(g.v[col])
		if !ok || got != want {
			bad(col, fmt.Sprintf("%v (%T)", g.v[col], g.v[col]), want)
		}
	}
	boolCol := func(col string, want *bool) {
		switch x := g.v[col].(type) {
		case nil:
			if want != nil {
				bad(col, "NULL", *want)
			}
		case bool:
			if want == nil || *want != x {
				w := any("NULL")
				if want != nil {
					w = *want
				}
				bad(col, x, w)
			}
		default:
			bad(col, fmt.Sprintf("%T", x), "bool")
		}
	}
	intListCol := func(col string, want []int64, present bool) {
		got, isNull, ok := e2eIntList(g.v[col])
		switch {
		case !ok:
			bad(col, fmt.Sprintf("%T", g.v[col]), "list of ints")
		case !present && !isNull:
			bad(col, got, "NULL")
		case present && isNull:
			bad(col, "NULL", want)
		case present && !reflect.DeepEqual(append([]int64{}, got...), append([]int64{}, want...)):
			bad(col, got, want)
		}
	}
	f32ListCol := func(col string, want []refF32Pair, present bool) {
		got, isNull, ok := e2eFloat32List(g.v[col])
		switch {
		case !ok:
			bad(col, fmt.Sprintf("%T", g.v[col]), "list of floats")
		case !present && !isNull:
			bad(col, got, "NULL")
		case present && isNull:
			bad(col, "NULL", want)
		case present:
			if len(got) != len(want) {
				bad(col, got, want)
				return
			}
			for i := range got {
				if got[i] != want[i][0] && got[i] != want[i][1] {
					bad(col, got, want)
					return
				}
			}
		}
	}
	jsonCol := func(col string, want any, present bool) {
		got, ok := e2eStr(g.v[col])
		switch {
		case !ok:
			bad(col, fmt.Sprintf("%T", g.v[col]), "JSON text")
		case !present && got != nil:
			bad(col, e2ePtrStr(got), "NULL")
		case present && got == nil:
			bad(col, "NULL", "JSON value")
		case present:
			v, err := refParseNormalizedJSON(*got)
			if err != nil {
				bad(col, e2ePtrStr(got)+" (not JSON: "+err.Error()+")", "JSON value")
			} else if !reflect.DeepEqual(v, want) {
				wb, _ := json.Marshal(want)
				bad(col, e2eClip(*got, 400), e2eClip(string(wb), 400)+" (numbers shown normalized)")
			}
		}
	}
	floatCol := func(col string, want *float64, tol float64) {
		switch x := g.v[col].(type) {
		case nil:
			if want != nil {
				bad(col, "NULL", *want)
			}
		default:
			f, ok := e2eFloat(x)
			if !ok {
				bad(col, fmt.Sprintf("%T", x), "double")
				return
			}
			if want == nil {
				bad(col, f, "NULL")
			} else if math.Abs(f-*want) > tol || math.IsNaN(f) {
				bad(col, strconv.FormatFloat(f, 'g', -1, 64), strconv.FormatFloat(*want, 'g', -1, 64))
			}
		}
	}

	strCol("group_id", &exp.GroupID)
	strCol("task_id", &exp.TaskID)
	if exp.RoleEmpty {
		if got, ok := e2eStr(g.v["role"]); !ok || (got != nil && *got != "") {
			bad("role", g.v["role"], `NULL or "" (role was "")`)
		}
	} else {
		strCol("role", exp.Role)
	}
	strCol("trajectory_id", &exp.TrajectoryID)
	strCol("step_id", &exp.StepID)
	intCol("step_index", exp.StepIndex)
	intCol("num_steps", exp.NumSteps)
	intCol("policy_version", exp.PolicyVersion)
	intCol("group_version", exp.GroupVersion)
	intListCol("prompt_ids", exp.PromptIDs, true)
	intListCol("response_ids", exp.ResponseIDs, true)
	f32ListCol("response_logprobs", exp.Logprobs, true)
	intListCol("token_versions", exp.TokenVersions, exp.HasTV)
	f32ListCol("teacher_logprobs", exp.Teacher, exp.HasTeacher)
	jsonCol("messages", exp.Messages, exp.HasMessages)
	floatCol("reward", &exp.Reward, 0)
	floatCol("step_reward", exp.StepReward, 0)
	floatCol("advantage", &exp.Advantage, 1e-6)
	intCol("group_size", exp.GroupSize)
	intCol("expected_group_size", exp.ExpectedGroupSize)
	boolCol("partial", &exp.Partial)
	strCol("finish_reason", exp.FinishReason)
	strCol("termination_reason", exp.Termination)
	boolCol("done", exp.Done)
	boolCol("is_correct", exp.IsCorrect)
	strCol("model", exp.Model)
	switch x := g.v["created_at"].(type) {
	case nil:
		if exp.CreatedAt != nil {
			bad("created_at", "NULL", exp.CreatedAt.Format(time.RFC3339Nano))
		}
	case time.Time:
		if exp.CreatedAt == nil || !x.Equal(*exp.CreatedAt) {
			w := "NULL"
			if exp.CreatedAt != nil {
				w = exp.CreatedAt.Format(time.RFC3339Nano)
			}
			bad("created_at", x.UTC().Format(time.RFC3339Nano), w)
		}
	default:
		bad("created_at", fmt.Sprintf("%T", x), "timestamp")
	}
	jsonCol("metadata", exp.Metadata, exp.HasMetadata)
	jsonCol("trajectory_metadata", exp.TrajMetadata, exp.HasTrajMetadata)
	// signals
	if null, _ := g.v["signals_null"].(bool); null {
		if exp.HasSignals {
			bad("signals", "NULL", exp.Signals)
		}
	} else {
		keys, _ := g.v["signals_keys"].([]any)
		vals, _ := g.v["signals_values"].([]any)
		got := map[string]float64{}
		for i := range keys {
			k, _ := keys[i].(string)
			f, _ := e2eFloat(vals[i])
			got[k] = f
		}
		switch {
		case !exp.HasSignals && len(got) != 0:
			bad("signals", got, "NULL (or empty)")
		case exp.HasSignals && !reflect.DeepEqual(got, exp.Signals):
			bad("signals", got, exp.Signals)
		}
	}
	strCol("source_file", &exp.SourceFile)
	intCol("source_line", exp.SourceLine)

	if want := fmt.Sprintf("policy=%d", exp.GroupVersion); !strings.HasPrefix(g.file, want+"/") {
		d = append(d, fmt.Sprintf("row is in shard %s, want directory %s (the group version)", g.file, want))
	}
	return d
}

// e2eErrLimiter caps repetitive error output per category.
type e2eErrLimiter struct {
	t     *testing.T
	n     map[string]int
	limit int
}

func (l *e2eErrLimiter) errorf(cat, format string, args ...any) {
	l.t.Helper()
	if l.n == nil {
		l.n = map[string]int{}
	}
	l.n[cat]++
	if l.n[cat] <= l.limit {
		l.t.Errorf(format, args...)
	}
}

func (l *e2eErrLimiter) summary() {
	l.t.Helper()
	for _, cat := range refSortedKeys(l.n) {
		if l.n[cat] > l.limit {
			l.t.Errorf("... %d more %q problems not shown (%d in total)", l.n[cat]-l.limit, cat, l.n[cat])
		}
	}
}

// e2eCheckOutput compares everything the program wrote under out against
// the reference result; lines are the exact input lines.
func e2eCheckOutput(t *testing.T, o *e2eOutput, ref *refResult, lines [][]byte, inputPath string) {
	t.Helper()
	lim := &e2eErrLimiter{t: t, limit: 25}
	defer lim.summary()

	// Rows: every expected step exactly once with the expected values, and
	// nothing else.
	byID := map[string][]*e2eGotRow{}
	for _, r := range o.rows {
		id, _ := e2eStr(r.v["step_id"])
		key := "<NULL>"
		if id != nil {
			key = *id
		}
		byID[key] = append(byID[key], r)
	}
	matched := 0
	for _, id := range refSortedKeys(ref.Rows) {
		exp := ref.Rows[id]
		got := byID[id]
		switch len(got) {
		case 0:
			lim.errorf("missing", "step %s (input line %d, trajectory %s) is missing from the committed shards", e2eShort(id), exp.SourceLine, e2eShort(exp.TrajectoryID))
			continue
		case 1:
		default:
			lim.errorf("dupe", "step %s appears %d times in the committed shards (files %v)", e2eShort(id), len(got), e2eFilesOf(got))
		}
		matched++
		if diffs := e2eCompareRow(exp, got[0]); len(diffs) > 0 {
			lim.errorf("values", "step %s (input line %d) has wrong values:\n  %s\n  input: %s", e2eShort(id), exp.SourceLine, strings.Join(diffs, "\n  "), e2eClip(string(lines[exp.SourceLine-1]), 600))
		}
	}
	for _, id := range refSortedKeys(byID) {
		if _, ok := ref.Rows[id]; !ok {
			r := byID[id][0]
			line, _ := e2eInt(r.v["source_line"])
			where := ""
			if line >= 1 && int(line) <= len(lines) {
				where = fmt.Sprintf(" (source_line %d: %s; the reference dead-letters it as %s)", line, e2eClip(string(lines[line-1]), 400), e2eDLReason(ref, int(line)))
			}
			lim.errorf("unexpected", "step %s should not be in the committed shards%s", e2eShort(id), where)
		}
	}
	if len(o.rows) != len(ref.Rows) {
		t.Errorf("committed shards hold %d rows, want %d", len(o.rows), len(ref.Rows))
	}
	t.Logf("compared %d expected rows (%d found) in %d shards, %d expected dead letters against %d in _dlq, %d dropped duplicates",
		len(ref.Rows), matched, len(o.committed), len(ref.DeadLetters), len(o.dlq), len(ref.DuplicateLines))

	// Dead letters.
	byLine := map[int64][]*e2eDLQEntry{}
	for _, e := range o.dlq {
		byLine[e.Source.Line] = append(byLine[e.Source.Line], e)
		for _, k := range []string{"reason", "error", "source", "record"} {
			if !e.keys[k] {
				lim.errorf("dlq-keys", "%s: dead letter lacks key %q: %s", e.where, k, e2eClip(e.rawLine, 300))
			}
		}
		if e.Source.File != inputPath {
			lim.errorf("dlq-file", "%s: source.file = %q, want %q", e.where, e.Source.File, inputPath)
		}
	}
	var dlLines []int
	for l := range ref.DeadLetters {
		dlLines = append(dlLines, l)
	}
	sort.Ints(dlLines)
	for _, l := range dlLines {
		want := ref.DeadLetters[l]
		got := byLine[int64(l)]
		if len(got) == 0 {
			lim.errorf("dlq-missing", "input line %d should be dead-lettered as %s but is not in _dlq (%s): %s", l, want.Reason, e2eFate(o, lines, l), e2eClip(strconv.Quote(string(want.Raw)), 400))
			continue
		}
		if len(got) > 1 {
			lim.errorf("dlq-dupe", "input line %d has %d dead letters (%s), want exactly one", l, len(got), e2eReasonsOf(got))
		}
		e := got[0]
		if e.Reason != want.Reason {
			lim.errorf("dlq-reason", "input line %d: dead-letter reason %q, want %q (error: %q)\n  line: %s", l, e.Reason, want.Reason, e.Error, e2eClip(strconv.Quote(string(want.Raw)), 400))
		}
		if strings.TrimSpace(e.Error) == "" {
			lim.errorf("dlq-error", "input line %d: empty error sentence", l)
		} else if want.Field != "" && e.Reason == want.Reason && !strings.Contains(e.Error, want.Field) {
			lim.errorf("dlq-error", "input line %d (%s): error %q does not name the field %q", l, want.Reason, e.Error, want.Field)
		}
		var rec []byte
		if utf8.Valid(want.Raw) {
			if e.RecordEncoding != "" {
				lim.errorf("dlq-record", "input line %d is valid UTF-8 but record_encoding = %q", l, e.RecordEncoding)
			}
			rec = []byte(e.Record)
		} else {
			if e.RecordEncoding != "base64" {
				lim.errorf("dlq-record", "input line %d is not valid UTF-8: want record_encoding \"base64\", got %q", l, e.RecordEncoding)
			}
			b, err := base64.StdEncoding.DecodeString(e.Record)
			if err != nil {
				lim.errorf("dlq-record", "input line %d: record is not std base64: %v", l, err)
			}
			rec = b
		}
		if !bytes.Equal(rec, want.Raw) {
			lim.errorf("dlq-record", "input line %d: record does not hold the original bytes\n  got:  %s\n  want: %s", l, e2eClip(strconv.Quote(string(rec)), 400), e2eClip(strconv.Quote(string(want.Raw)), 400))
		}
	}
	for _, l := range refSortedInt64Keys(byLine) {
		if _, ok := ref.DeadLetters[int(l)]; ok {
			continue
		}
		what := "an out-of-range line number"
		if l >= 1 && int(l) <= len(lines) {
			what = e2eClip(strconv.Quote(string(lines[l-1])), 400)
			if _, kept := e2eStepAtLine(ref, int(l)); kept {
				what += " (the reference writes this step)"
			} else if e2eIsDupLine(ref, int(l)) {
				what += " (the reference drops this line as an identical retry)"
			}
		}
		for _, e := range byLine[l] {
			lim.errorf("dlq-unexpected", "input line %d should not be dead-lettered, got reason %q (error %q): %s", l, e.Reason, e.Error, what)
		}
	}

	// Manifest.
	mpaths := map[string]int64{}
	var msum int64
	for _, m := range o.manifest {
		p := m.Path
		if p == "" {
			// A checkpoint: it settles dead letters and dropped retries
			// between commits (one is made at a tick of a slow run).
			if m.Rows != 0 {
				t.Errorf("a checkpoint lists %d rows", m.Rows)
			}
			continue
		}
		if _, dup := mpaths[p]; dup {
			t.Errorf("manifest lists %q more than once", p)
		}
		mpaths[p] = m.Rows
		msum += m.Rows
	}
	var total int64
	for _, f := range o.committed {
		total += o.fileRows[f]
		rows, ok := mpaths[f]
		if !ok {
			t.Errorf("committed shard %s is not in _manifest/shards.jsonl", f)
		} else if rows != o.fileRows[f] {
			t.Errorf("manifest says %s has %d rows; DuckDB reads %d", f, rows, o.fileRows[f])
		}
	}
	for _, p := range refSortedKeys(mpaths) {
		if _, ok := o.fileRows[p]; !ok {
			t.Errorf("manifest lists %q which is not a committed shard (committed: %v)", p, e2eClipList(o.committed))
		}
	}
	if msum != total {
		t.Errorf("manifest rows sum to %d; committed shards hold %d rows", msum, total)
	}

	// Stats.
	if o.stats != nil {
		dlCounts := ref.deadLetterCounts()
		want := map[string]int{
			"records_read":         ref.RecordsRead,
			"steps_written":        len(ref.Rows),
			"trajectories_written": ref.TrajectoriesWritten,
			"groups_written":       ref.GroupsWritten,
			"partial_groups":       ref.PartialGroups,
			"duplicates_dropped":   len(ref.DuplicateLines),
			"utf8_repaired":        ref.UTF8Repaired,
			"dead_letters_total":   len(ref.DeadLetters),
			"shards_committed":     len(o.committed),
		}
		for _, k := range refSortedKeys(want) {
			got, ok := e2eStatInt(o.stats[k])
			if !ok {
				t.Errorf("stats: %q missing or not an integer (%v)", k, o.stats[k])
			} else if got != int64(want[k]) {
				t.Errorf("stats: %s = %d, want %d", k, got, want[k])
			}
		}
		gotDL, ok := o.stats["dead_letters"].(map[string]any)
		if !ok {
			t.Errorf("stats: dead_letters is not an object: %v", o.stats["dead_letters"])
		} else {
			keys := map[string]bool{}
			for k := range gotDL {
				keys[k] = true
			}
			for k := range dlCounts {
				keys[k] = true
			}
			for _, k := range refSortedKeys(keys) {
				g, ok := e2eStatInt(gotDL[k])
				if gotDL[k] == nil {
					g, ok = 0, true
				}
				if !ok || g != int64(dlCounts[k]) {
					t.Errorf("stats: dead_letters[%s] = %v, want %d", k, gotDL[k], dlCounts[k])
				}
			}
		}
	}
}

func e2eStatInt(v any) (int64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	i, err := n.Int64()
	return i, err == nil
}

func e2eFilesOf(rows []*e2eGotRow) []string {
	var f []string
	for _, r := range rows {
		f = append(f, r.file)
	}
	return f
}

func e2eReasonsOf(es []*e2eDLQEntry) string {
	var s []string
	for _, e := range es {
		s = append(s, e.Reason)
	}
	return strings.Join(s, ",")
}

func e2eClipList(s []string) string {
	if len(s) > 10 {
		return fmt.Sprintf("%v ... (%d)", s[:10], len(s))
	}
	return fmt.Sprint(s)
}

func refSortedInt64Keys[V any](m map[int64]V) []int64 {
	var ks []int64
	for k := range m {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	return ks
}

func e2eDLReason(ref *refResult, line int) string {
	if d, ok := ref.DeadLetters[line]; ok {
		return d.Reason
	}
	if e2eIsDupLine(ref, line) {
		return "(none: identical retry, dropped)"
	}
	return "(none)"
}

func e2eIsDupLine(ref *refResult, line int) bool {
	for _, l := range ref.DuplicateLines {
		if l == line {
			return true
		}
	}
	return false
}

func e2eStepAtLine(ref *refResult, line int) (*refRow, bool) {
	for _, r := range ref.Rows {
		if int(r.SourceLine) == line {
			return r, true
		}
	}
	return nil, false
}

// e2eFate describes what the program did with a line (for messages).
func e2eFate(o *e2eOutput, lines [][]byte, line int) string {
	for _, r := range o.rows {
		if l, _ := e2eInt(r.v["source_line"]); int(l) == line {
			id, _ := e2eStr(r.v["step_id"])
			return "the program wrote it as a row, step_id " + e2ePtrStr(id)
		}
	}
	return "no row has this source_line either; dropped as a duplicate or accepted as a trajectory record?"
}

// ---------------------------------------------------------------------------
// Corpus test

// e2eBuildCorpus assembles the combined input and checks the reference
// against the authors' intent for every line.
func e2eBuildCorpus(t *testing.T) []e2eLine {
	t.Helper()
	var all []e2eLine
	all = append(all, e2eLoadAnnotated(t, filepath.Join("testdata", "awkward.jsonl"))...)
	all = append(all, e2eUTF8Lines()...)
	all = append(all, e2eLargeLines()...)
	all = append(all, e2eLoadAnnotated(t, filepath.Join("testdata", "bad.jsonl"))...)
	all = append(all, e2eOddLines()...)
	all = append(all, e2eMutationLines()...)
	return all
}

func e2eCheckReferenceIntent(t *testing.T, corpus []e2eLine, ref *refResult) {
	t.Helper()
	seen := map[string]bool{}
	for i, l := range corpus {
		line := i + 1
		if refIsBlankLine(l.raw) {
			continue
		}
		repeat := seen[string(l.raw)]
		seen[string(l.raw)] = true
		dl, isDL := ref.DeadLetters[line]
		isDup := e2eIsDupLine(ref, line)
		switch {
		case repeat && !isDL:
			if !isDup {
				t.Errorf("reference self-check: %s (line %d) repeats an earlier line but is not a dropped duplicate", l.origin, line)
			}
		case l.hasIntent:
			if !isDL {
				t.Errorf("reference self-check: %s (line %d) is meant to be %s but the reference does not dead-letter it", l.origin, line, l.reason)
			} else if dl.Reason != l.reason {
				t.Errorf("reference self-check: %s (line %d) is meant to be %s, reference says %s", l.origin, line, l.reason, dl.Reason)
			} else if l.field != "" && dl.Field != l.field {
				t.Errorf("reference self-check: %s (line %d) field %q, reference names %q", l.origin, line, l.field, dl.Field)
			}
		default:
			if isDL {
				t.Errorf("reference self-check: %s (line %d) is meant to be valid, reference dead-letters it as %s", l.origin, line, dl.Reason)
			}
		}
	}
	covered := ref.deadLetterCounts()
	for _, r := range refAllReasons {
		if covered[r] == 0 {
			t.Errorf("corpus does not exercise reason %s", r)
		}
	}
}

// e2eSpot holds hand-computed expectations for a few corpus steps,
// independent of the reference implementation.
type e2eSpot struct {
	groupVersion, groupSize, expected int64
	partial                           bool
	advantage                         float64
}

func e2eSpotChecks() map[string]e2eSpot {
	g1 := 0.5 / (math.Sqrt(1.0/6) + 1e-6) // rewards 1, 0.5, 0
	pm := 0.5 / (0.5 + 1e-6)              // rewards 1, 0
	return map[string]e2eSpot{
		"A1-s0": {2, 3, 3, false, g1}, "A1-s1": {2, 3, 3, false, g1},
		"A2-s0": {2, 3, 3, false, 0}, "A2-s1": {2, 3, 3, false, 0},
		"A3-s0": {2, 3, 3, false, -g1},
		// C1's last token was generated at 6: the group is as old as it.
		"C1-s0": {6, 4, 4, false, 1.732046807578115},
		"C2-s0": {6, 4, 4, false, -0.5773489358593717},
		"C3-s0": {6, 4, 4, false, -0.5773489358593717},
		"C4-s0": {6, 4, 4, false, -0.5773489358593717},
		"S1-s0": {0, 1, 1, false, 0.7}, "S1-s1": {0, 1, 1, false, 0.7}, "S1-s2": {0, 1, 1, false, 0.7},
		"D1-s0": {4, 3, 3, false, math.NaN()}, "D3-s0": {4, 3, 3, false, math.NaN()},
		"E1-s0": {0, 3, 3, false, 0}, "E2-s0": {0, 3, 3, false, 0}, "E3-s0": {0, 3, 3, false, 0},
		"b1-s0": {1, 2, 2, false, pm}, "b2-s0": {1, 2, 2, false, -pm}, "b2-s1": {1, 2, 2, false, -pm},
		"p1-s0": {4, 2, 3, true, pm}, "p2-s0": {4, 2, 3, true, -pm},
		"NZ1-s0": {0, 1, 1, false, 0.5}, "UF1-s0": {1, 1, 1, false, 0},
		"BIG1-s0": {0, 1, 1, false, 0.5}, "BIG2-s0": {math.MaxInt64, 1, 1, false, 0.5}, // BIG1's second token is at 0
	}
}

func e2eCheckSpots(t *testing.T, rows []*e2eGotRow, fromRef map[string]*refRow) {
	t.Helper()
	byID := map[string]*e2eGotRow{}
	for _, r := range rows {
		if id, _ := e2eStr(r.v["step_id"]); id != nil {
			byID[*id] = r
		}
	}
	for id, s := range e2eSpotChecks() {
		if fromRef != nil { // self-check of the reference
			r := fromRef[id]
			if r == nil {
				t.Errorf("reference self-check: spot step %s not written", id)
				continue
			}
			if r.GroupVersion != s.groupVersion || r.GroupSize != s.groupSize || r.ExpectedGroupSize != s.expected || r.Partial != s.partial ||
				(!math.IsNaN(s.advantage) && math.Abs(r.Advantage-s.advantage) > 1e-6) {
				t.Errorf("reference self-check: spot %s: reference group_version/size/expected/partial/advantage = %d/%d/%d/%v/%.17g, hand-computed %+v",
					id, r.GroupVersion, r.GroupSize, r.ExpectedGroupSize, r.Partial, r.Advantage, s)
			}
			continue
		}
		r := byID[id]
		if r == nil {
			continue // reported by the main comparison
		}
		gv, _ := e2eInt(r.v["group_version"])
		gs, _ := e2eInt(r.v["group_size"])
		eg, _ := e2eInt(r.v["expected_group_size"])
		p, _ := r.v["partial"].(bool)
		adv, _ := e2eFloat(r.v["advantage"])
		if gv != s.groupVersion || gs != s.groupSize || eg != s.expected || p != s.partial {
			t.Errorf("hand-checked step %s: group_version/group_size/expected_group_size/partial = %d/%d/%d/%v, want %d/%d/%d/%v",
				id, gv, gs, eg, p, s.groupVersion, s.groupSize, s.expected, s.partial)
		}
		if !math.IsNaN(s.advantage) && math.Abs(adv-s.advantage) > 1e-6 {
			t.Errorf("hand-checked step %s: advantage %.17g, want %.17g", id, adv, s.advantage)
		}
	}
}

func TestEndToEndCorpus(t *testing.T) {
	corpus := e2eBuildCorpus(t)
	lines := make([][]byte, len(corpus))
	for i, l := range corpus {
		lines[i] = l.raw
	}
	work := t.TempDir()
	in := filepath.Join(work, "in.jsonl")
	if err := os.WriteFile(in, e2eJoinLines(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	const groupSize = 3

	ref, err := refIngest(lines, in, groupSize, 2)
	if err != nil {
		t.Fatalf("corpus is outside the specified behaviour: %v", err)
	}
	e2eCheckReferenceIntent(t, corpus, ref)
	e2eCheckSpots(t, nil, ref.Rows)
	if ref.UTF8Repaired != 4 || len(ref.DuplicateLines) < 5 || ref.PartialGroups != 1 {
		t.Errorf("reference self-check: utf8_repaired=%d duplicates=%d partial=%d", ref.UTF8Repaired, len(ref.DuplicateLines), ref.PartialGroups)
	}
	if t.Failed() {
		t.Fatal("the reference disagrees with the corpus annotations; fix the test before blaming the program")
	}

	bin := e2eBinary(t)
	for _, tc := range []struct {
		name     string
		minGroup int
		flags    []string
	}{
		{"default-min-group-size", 2, nil},
		{"min-group-size-3", 3, []string{"--min-group-size", "3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref := ref
			if tc.minGroup != 2 {
				var err error
				if ref, err = refIngest(lines, in, groupSize, tc.minGroup); err != nil {
					t.Fatalf("reference: %v", err)
				}
			}
			out := filepath.Join(work, "out-"+tc.name)
			stats := filepath.Join(work, "stats-"+tc.name+".json")
			e2eIngest(t, bin, work, in, out, stats, append([]string{"--group-size", strconv.Itoa(groupSize)}, tc.flags...)...)
			o := e2eReadOutput(t, out, stats)
			e2eCheckOutput(t, o, ref, lines, in)
			if tc.minGroup == 2 {
				e2eCheckSpots(t, o.rows, nil)
			}
		})
	}
}

// ---------------------------------------------------------------------------
// Generated traces

type e2ePQStep struct {
	count int
	nResp int
	sum   int64
}

// e2eReadWithParquetGo reads every committed shard with parquet-go
// (independently of DuckDB): step_id multiset, response token count and sum
// of response token ids per step, and the row count of each file.
func e2eReadWithParquetGo(t *testing.T, out string, files []string) (map[string]*e2ePQStep, map[string]int64) {
	t.Helper()
	steps := map[string]*e2ePQStep{}
	fileRows := map[string]int64{}
	for _, rel := range files {
		f, err := os.Open(filepath.Join(out, filepath.FromSlash(rel)))
		if err != nil {
			t.Fatal(err)
		}
		st, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		pf, err := parquet.OpenFile(f, st.Size())
		if err != nil {
			f.Close()
			t.Fatalf("parquet-go cannot open %s: %v", rel, err)
		}
		schema := pf.Schema()
		stepCol, respCol := -1, -1
		var respPath []string
		for i, p := range schema.Columns() {
			if len(p) == 1 && p[0] == "step_id" {
				stepCol = i
			}
			if len(p) >= 1 && p[0] == "response_ids" {
				if respCol >= 0 {
					t.Fatalf("%s: response_ids has more than one leaf column", rel)
				}
				respCol, respPath = i, p
			}
		}
		if stepCol < 0 || respCol < 0 {
			f.Close()
			t.Fatalf("%s: parquet-go finds no step_id / response_ids leaf columns (columns %v)", rel, schema.Columns())
		}
		leaf, ok := schema.Lookup(respPath...)
		if !ok {
			t.Fatalf("%s: lookup %v failed", rel, respPath)
		}
		maxDef := leaf.MaxDefinitionLevel
		var n int64
		for _, rg := range pf.RowGroups() {
			rows := rg.Rows()
			buf := make([]parquet.Row, 128)
			for {
				k, err := rows.ReadRows(buf)
				for _, row := range buf[:k] {
					var id string
					var idSet bool
					var cnt int
					var sum int64
					for _, v := range row {
						switch v.Column() {
						case stepCol:
							if !v.IsNull() {
								id, idSet = string(v.ByteArray()), true
							}
						case respCol:
							if v.DefinitionLevel() == maxDef {
								cnt++
								switch v.Kind() {
								case parquet.Int32:
									sum += int64(v.Int32())
								case parquet.Int64:
									sum += v.Int64()
								default:
									t.Fatalf("%s: response_ids element of kind %v", rel, v.Kind())
								}
							}
						}
					}
					if !idSet {
						t.Errorf("%s: a row has a null step_id (parquet-go)", rel)
					}
					s := steps[id]
					if s == nil {
						s = &e2ePQStep{}
						steps[id] = s
					}
					s.count++
					s.nResp += cnt
					s.sum += sum
					n++
				}
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("%s: parquet-go ReadRows: %v", rel, err)
				}
			}
			rows.Close()
		}
		if n != pf.NumRows() {
			t.Errorf("%s: parquet-go read %d rows, footer says %d", rel, n, pf.NumRows())
		}
		fileRows[rel] = n
		f.Close()
	}
	return steps, fileRows
}

func TestEndToEndGenerated(t *testing.T) {
	t.Parallel() // see main_test.go
	bin := e2eBinary(t)
	for _, tc := range []struct {
		name              string
		groups, groupSize int
		roles             int
		extra             []string
	}{
		// Token lists of a few dozen ids: what is checked is every step,
		// group and duplicate, not the bulk (bench-* measures that).
		{"groups200x6", 200, 6, 1, []string{"--seed", "20240501", "--teacher", "--duplicates", "0.05", "--prompt-len", "48", "--response-len", "24"}},
		{"roles-token-versions", 40, 4, 2, []string{"--seed", "7", "--roles", "solver,verifier", "--token-versions", "--teacher", "--duplicates", "0.1", "--shuffle", "0.6", "--max-steps", "6", "--prompt-len", "48", "--response-len", "24"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e2eGeneratedCase(t, bin, tc.groups, tc.groupSize, tc.roles, tc.extra)
		})
	}
}

func e2eGeneratedCase(t *testing.T, bin string, groups, groupSize, roles int, extra []string) {
	work := t.TempDir()
	in := filepath.Join(work, "gen.jsonl")
	genArgs := func(out string) []string {
		return append([]string{"gen", "--to", out, "--groups", strconv.Itoa(groups), "--group-size", strconv.Itoa(groupSize)}, extra...)
	}
	if r := e2eRun(t, bin, work, genArgs(in)...); r.code != 0 {
		t.Fatalf("rllm-pipe gen: exit %d\n%s", r.code, e2eClip(r.stderr, 4000))
	}
	data, err := os.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	lines := e2eSplitLines(data)

	t.Run("gen-deterministic", func(t *testing.T) {
		again := filepath.Join(work, "gen-again.jsonl")
		if r := e2eRun(t, bin, work, genArgs(again)...); r.code != 0 {
			t.Fatalf("rllm-pipe gen: exit %d\n%s", r.code, e2eClip(r.stderr, 4000))
		}
		data2, err := os.ReadFile(again)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(data, data2) {
			t.Errorf("gen with the same --seed produced different output")
		}
	})

	ref, err := refIngest(lines, in, groupSize, 2)
	if err != nil {
		t.Fatalf("generated traces fall outside the specified behaviour: %v", err)
	}
	// gen must write valid, complete traces with some exact duplicates.
	if n := len(ref.DeadLetters); n > 0 {
		shown := 0
		for l := 1; l <= len(lines) && shown < 10; l++ {
			if d, ok := ref.DeadLetters[l]; ok {
				t.Errorf("gen wrote a line the spec rejects: line %d (%s): %s", l, d.Reason, e2eClip(string(d.Raw), 300))
				shown++
			}
		}
		t.Errorf("gen wrote %d lines the spec rejects", n)
	}
	if ref.GroupsWritten != groups*roles || ref.PartialGroups != 0 || ref.TrajectoriesWritten != groups*roles*groupSize {
		t.Errorf("gen: reference assembles %d groups (%d partial) of %d trajectories, want %d full groups of %d", ref.GroupsWritten, ref.PartialGroups, ref.TrajectoriesWritten, groups*roles, groupSize)
	}
	if len(ref.DuplicateLines) == 0 {
		t.Errorf("gen --duplicates 0.05 wrote no exact duplicate lines")
	}
	teacher := 0
	for _, r := range ref.Rows {
		if r.HasTeacher {
			teacher++
		}
	}
	if teacher != len(ref.Rows) {
		t.Errorf("gen --teacher: %d of %d steps carry teacher_logprobs", teacher, len(ref.Rows))
	}
	t.Logf("generated %d lines: %d steps, %d duplicates", len(lines), len(ref.Rows), len(ref.DuplicateLines))

	out := filepath.Join(work, "out")
	stats := filepath.Join(work, "stats.json")
	e2eIngest(t, bin, work, in, out, stats, "--group-size", strconv.Itoa(groupSize), "--min-group-size", "2")
	o := e2eReadOutput(t, out, stats)
	e2eCheckOutput(t, o, ref, lines, in)

	// Second, independent reader.
	pq, pqRows := e2eReadWithParquetGo(t, out, o.committed)
	for _, f := range o.committed {
		if pqRows[f] != o.fileRows[f] {
			t.Errorf("%s: parquet-go reads %d rows, DuckDB %d", f, pqRows[f], o.fileRows[f])
		}
	}
	duck := map[string]*e2ePQStep{}
	for _, r := range o.rows {
		id, _ := e2eStr(r.v["step_id"])
		if id == nil {
			continue
		}
		s := duck[*id]
		if s == nil {
			s = &e2ePQStep{}
			duck[*id] = s
		}
		ids, _, _ := e2eIntList(r.v["response_ids"])
		s.count++
		s.nResp += len(ids)
		for _, x := range ids {
			s.sum += x
		}
	}
	var totPQ, totDuck, totRef int
	lim := &e2eErrLimiter{t: t, limit: 20}
	for _, id := range refSortedKeys(ref.Rows) {
		want := ref.Rows[id]
		var wsum int64
		for _, x := range want.ResponseIDs {
			wsum += x
		}
		totRef += len(want.ResponseIDs)
		p, d := pq[id], duck[id]
		if p == nil || p.count != 1 {
			lim.errorf("pq", "parquet-go: step %s present %v times, want once", e2eShort(id), p)
			continue
		}
		if p.nResp != len(want.ResponseIDs) || p.sum != wsum {
			lim.errorf("pq", "parquet-go: step %s has %d response tokens (sum %d), want %d (sum %d)", e2eShort(id), p.nResp, p.sum, len(want.ResponseIDs), wsum)
		}
		if d != nil && (d.nResp != p.nResp || d.sum != p.sum) {
			lim.errorf("pq", "step %s: DuckDB %d tokens (sum %d) vs parquet-go %d (sum %d)", e2eShort(id), d.nResp, d.sum, p.nResp, p.sum)
		}
	}
	for id, p := range pq {
		totPQ += p.nResp
		if _, ok := ref.Rows[id]; !ok {
			lim.errorf("pq", "parquet-go: unexpected step %s", e2eShort(id))
		}
	}
	for _, d := range duck {
		totDuck += d.nResp
	}
	lim.summary()
	if totPQ != totRef || totDuck != totRef {
		t.Errorf("total response tokens: parquet-go %d, DuckDB %d, reference %d", totPQ, totDuck, totRef)
	}
	if len(pq) != len(ref.Rows) {
		t.Errorf("parquet-go sees %d distinct step_ids, want %d", len(pq), len(ref.Rows))
	}
}

// ---------------------------------------------------------------------------
// Hostile identifiers

func TestHostileIDs(t *testing.T) {
	long := strings.Repeat("L/../", 2000) // 10,000 chars
	h := []string{
		"../../../../escape-hostile",                // 0
		"/abs/olute-hostile",                        // 1
		`a\b\..\..\c-hostile`,                       // 2
		"quote\"s'and`back`$(touch pwned-hostile)",  // 3
		"ctl\x01\x02\x1f\x7f\t\r\n\v\f-end-hostile", // 4
		"日本語/émoji😀/\u202eRTL\u200b-hostile",        // 5
		"policy=99",                      // 6
		"_dlq",                           // 7
		"..",                             // 8
		".",                              // 9
		"%2e%2e%2f%00-hostile",           // 10
		`C:\Windows\System32\hostile`,    // 11
		"with space and *?<>|: -hostile", // 12
		long,                             // 13
		"/",                              // 14
		"../_manifest/shards.jsonl",      // 15
		"~root-hostile",                  // 16
		strings.Repeat("é", 5000),        // 17: 10,000 bytes
	}
	step := func(stepID, task string, group, role *string, traj string, idx, policy int64) []byte {
		m := map[string]any{
			"type": "step", "step_id": stepID, "task_id": task, "trajectory_id": traj,
			"step_index": idx, "policy_version": policy, "prompt_ids": []int{1, 2}, "response_ids": []int{3},
			"response_logprobs": []float64{-0.5}, "model": h[5], "finish_reason": h[4],
			"metadata": map[string]any{h[0]: h[3]},
		}
		if group != nil {
			m["group_id"] = *group
		}
		if role != nil {
			m["role"] = *role
		}
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	traj := func(id, task string, group, role *string, reward float64, n int64, size int64) []byte {
		m := map[string]any{
			"type": "trajectory", "trajectory_id": id, "task_id": task, "reward": reward, "num_steps": n,
			"group_size": size, "termination_reason": h[3], "signals": map[string]any{h[1]: 1, h[13]: 0.5},
			"metadata": map[string]any{"path": h[2]},
		}
		if group != nil {
			m["group_id"] = *group
		}
		if role != nil {
			m["role"] = *role
		}
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	ptr := func(s string) *string { return &s }
	var lines [][]byte
	// Group 1: key task_id:role built from hostile parts.
	lines = append(lines,
		step(h[4], h[0], nil, ptr(h[2]), h[1], 0, 3),
		traj(h[1], h[0], nil, ptr(h[2]), 1, 2, 2),
		step(h[5], h[0], nil, ptr(h[2]), h[3], 0, 3),
		step(h[6]+"/step", h[0], nil, ptr(h[2]), h[1], 1, 4),
		traj(h[3], h[0], nil, ptr(h[2]), 0, 1, 2),
	)
	// Group 2: explicit hostile group_id.
	lines = append(lines,
		traj(h[7], h[6], ptr(long), ptr(h[11]), 0.25, 1, 2),
		traj(h[8], h[6], ptr(long), ptr(h[11]), 0.75, 1, 2),
		step(h[9], h[6], ptr(long), ptr(h[11]), h[7], 0, 12),
		step(h[13], h[6], ptr(long), ptr(h[11]), h[8], 0, 11),
	)
	// Group 3: complete group of hostile ids.
	lines = append(lines,
		traj(h[14], h[12], ptr(h[15]), nil, 1, 1, 2),
		step(h[10], h[12], ptr(h[15]), nil, h[14], 0, 0),
		traj(h[16], h[12], ptr(h[15]), nil, 0, 1, 2),
		step(h[17], h[12], ptr(h[15]), nil, h[16], 0, 1),
	)
	// Group 4: incomplete group (dead-lettered) with hostile ids.
	lines = append(lines,
		traj(h[13]+"x", h[11], ptr(h[0]), nil, 1, 1, 2),
		step(h[1]+"/dlq", h[11], ptr(h[0]), nil, h[13]+"x", 0, 2),
	)

	base := t.TempDir()
	parent := filepath.Join(base, "work")
	if err := os.Mkdir(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	in := filepath.Join(parent, "in.jsonl")
	out := filepath.Join(parent, "out")
	if err := os.WriteFile(in, e2eJoinLines(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	stats := filepath.Join(t.TempDir(), "stats.json")

	ref, err := refIngest(lines, in, 2, 2)
	if err != nil {
		t.Fatalf("reference: %v", err)
	}
	if len(ref.Rows) != 7 || len(ref.DeadLetters) != 2 || ref.GroupsWritten != 3 {
		t.Fatalf("reference self-check: %d rows, %d dead letters, %d groups; want 7, 2, 3", len(ref.Rows), len(ref.DeadLetters), ref.GroupsWritten)
	}

	// Snapshot of names in every ancestor directory, to spot escapes.
	ancestors := []string{}
	for d := filepath.Dir(parent); ; d = filepath.Dir(d) {
		ancestors = append(ancestors, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	snapshot := func() map[string]bool {
		s := map[string]bool{}
		for _, d := range ancestors {
			ents, _ := os.ReadDir(d)
			for _, e := range ents {
				s[filepath.Join(d, e.Name())] = true
			}
		}
		return s
	}
	before := snapshot()

	bin := e2eBinary(t)
	e2eIngest(t, bin, parent, in, out, stats, "--group-size", "2")

	// Nothing may appear in the parent except the input file and OUT.
	err = filepath.WalkDir(parent, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(parent, p)
		if rel == "." || rel == "in.jsonl" || rel == "out" || strings.HasPrefix(rel, "out"+string(filepath.Separator)) {
			return nil
		}
		t.Errorf("ingest created %s outside OUT", e2eShort(p))
		if d.IsDir() {
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	after := snapshot()
	for p := range after {
		if !before[p] && strings.Contains(p, "hostile") {
			t.Errorf("ingest created %s outside its output directory", e2eShort(p))
		}
	}
	for p := range after {
		if !before[p] && filepath.Dir(p) == base {
			t.Errorf("ingest created %s next to the parent directory", e2eShort(p))
		}
	}
	for _, p := range []string{"/abs", "/escape-hostile", filepath.Join(filepath.Dir(base), "escape-hostile")} {
		if _, err := os.Lstat(p); err == nil && !before[p] {
			t.Errorf("ingest created %s", p)
		}
	}
	// Not required by the spec, but worth seeing: file names inside OUT
	// derived from ids.
	_ = filepath.WalkDir(out, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.Contains(d.Name(), "hostile") {
			t.Logf("note: a path inside OUT is built from a hostile id: %s", e2eShort(p))
		}
		return nil
	})

	o := e2eReadOutput(t, out, stats)
	e2eCheckOutput(t, o, ref, lines, in)
}

// TestSecondWriterRefused: while one ingest holds an output folder (here
// waiting on stdin), a second ingest into it fails at once with a message
// naming the first, and writes nothing; once the first is done, the second
// goes through, and every group is committed once.
func TestSecondWriterRefused(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	out := filepath.Join(work, "out")
	gen := filepath.Join(work, "gen.jsonl")
	if r := e2eRun(t, bin, work, "gen", "--to", gen, "--groups", "40", "--group-size", "4", "--seed", "3", "--quiet"); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	first := exec.Command(bin, "ingest", "--from", "-", "--to", out, "--group-size", "4", "--quiet")
	first.Env = e2eEnv()
	stdin, err := first.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var firstErr bytes.Buffer
	first.Stderr = &firstErr
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	defer first.Process.Kill()
	defer watchdog(first, 3*time.Minute)()
	// The first holds the lock once it has opened the output.
	lock := filepath.Join(out, "_manifest", "lock")
	for deadline := time.Now().Add(30 * time.Second); ; {
		if b, _ := os.ReadFile(lock); bytes.Contains(b, []byte("writer")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the first ingest never took the folder: %s", firstErr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	r := e2eRun(t, bin, work, "ingest", "--from", gen, "--to", out, "--group-size", "4", "--quiet")
	if r.code == 0 || !strings.Contains(r.stderr, "another writer") || !strings.Contains(r.stderr, fmt.Sprintf("pid %d", first.Process.Pid)) {
		t.Fatalf("second ingest: exit %d, stderr %s", r.code, r.stderr)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "_manifest", "shards.jsonl")); len(b) != 0 {
		t.Fatalf("the refused ingest wrote to the manifest: %s", b)
	}
	stdin.Close()
	if err := first.Wait(); err != nil {
		t.Fatalf("first ingest: %v\n%s", err, firstErr.String())
	}
	if r := e2eRun(t, bin, work, "ingest", "--from", gen, "--to", out, "--group-size", "4", "--quiet"); r.code != 0 {
		t.Fatalf("second ingest after the first: exit %d: %s", r.code, r.stderr)
	}
	entries, err := local.ReadManifest(out)
	if err != nil {
		t.Fatal(err)
	}
	steps := map[string]int{}
	for _, e := range entries {
		for _, k := range e.GroupKeys {
			steps[k]++
		}
	}
	if len(steps) == 0 {
		t.Fatal("nothing committed")
	}
	for k, n := range steps {
		if n != 1 {
			t.Errorf("group %s committed %d times", k, n)
		}
	}
}
