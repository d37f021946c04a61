package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/rllm-pipe/rllm-pipe/cmd/internal/cli"
	"github.com/rllm-pipe/rllm-pipe/cmd/internal/clitest"
)

// commands walks every command under a fresh root, by path ("export sft").
func commands(t *testing.T) map[string]*cobra.Command {
	t.Helper()
	out := map[string]*cobra.Command{}
	var walk func(c *cobra.Command, path string)
	walk = func(c *cobra.Command, path string) {
		if c.Name() == "help" || c.Name() == "completion" || c.Hidden {
			return
		}
		out[path] = c
		for _, sub := range c.Commands() {
			walk(sub, strings.TrimSpace(path+" "+sub.Name()))
		}
	}
	walk(newRoot(context.Background()), "")
	return out
}

// Flags appear only on commands that use them: Kafka's on the commands
// that reach Kafka; every command takes --quiet and --log-format.
func TestFlagsWhereUsed(t *testing.T) {
	kafka := map[string]bool{"ingest": true, "gateway": true, "produce": true}
	for path, c := range commands(t) {
		fs := c.Flags()
		fs.AddFlagSet(c.InheritedFlags())
		for _, g := range []string{"quiet", "log-format"} {
			if fs.Lookup(g) == nil {
				t.Errorf("%q has no --%s", path, g)
			}
		}
		if has := fs.Lookup("kafka-tls") != nil; has != kafka[path] {
			t.Errorf("%q: --kafka-tls present %v, want %v", path, has, kafka[path])
		}
	}
}

var exampleLine = regexp.MustCompile(`(?m)^\s+(?:cat \S+ \| )?rllm-pipe (.*)$`)

// Every runnable command's help has examples, and every example parses:
// its command exists and takes every flag given.
func TestEveryCommandHasExamples(t *testing.T) {
	cmds := commands(t)
	for path, c := range cmds {
		if path == "" || path == "iceberg" || !c.Runnable() && !c.HasSubCommands() {
			continue
		}
		if c.Example == "" {
			t.Errorf("%q has no examples", path)
			continue
		}
		joined := regexp.MustCompile(`\\\n\s*`).ReplaceAllString(c.Example, "") // continuation lines
		for _, m := range exampleLine.FindAllStringSubmatch(joined, -1) {
			line := m[1]
			if i := strings.Index(line, " | "); i >= 0 {
				line = line[:i] // the first command of a pipe
			}
			args := strings.Fields(line)
			target, rest := "", args
			for len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
				p := strings.TrimSpace(target + " " + rest[0])
				if cmds[p] == nil {
					break
				}
				target, rest = p, rest[1:]
			}
			tc := cmds[target]
			if tc == nil || target == "" {
				t.Errorf("%q: example %q names no command", path, line)
				continue
			}
			fs := pflag.NewFlagSet(target, pflag.ContinueOnError)
			fs.SetOutput(io.Discard)
			fs.AddFlagSet(tc.Flags())
			fs.AddFlagSet(tc.InheritedFlags())
			if err := fs.Parse(rest); err != nil {
				t.Errorf("%q: example %q: %v", path, line, err)
			}
			for _, name := range []string{"out", "as", "partitions", "whole-prompts", "shutdown-timeout", "no-requests"} {
				if f := fs.Lookup(name); f != nil && f.Changed {
					t.Errorf("%q: example %q uses the deprecated --%s", path, line, name)
				}
			}
		}
	}
}

// Help is wrapped: no line of any command's help is wider than the
// wrapping column.
func TestHelpIsWrapped(t *testing.T) {
	for path := range commands(t) {
		if path == "iceberg" {
			continue // rllm-pipe-iceberg's help, tested there
		}
		var out bytes.Buffer
		args := append(strings.Fields(path), "--help")
		if code := run(context.Background(), args, &out, io.Discard); code != exitOK {
			t.Fatalf("%v: exit %d", args, code)
		}
		for _, l := range strings.Split(out.String(), "\n") {
			if n := len([]rune(l)); n > cli.HelpWidth {
				t.Errorf("%q --help: a line of %d columns: %.60q...", path, n, l)
			}
		}
	}
}

// The old flag names work one release, with a warning naming the new one.
func TestRenamedFlagsStillWork(t *testing.T) {
	dir := t.TempDir()
	var stderr bytes.Buffer
	out := filepath.Join(dir, "t.jsonl")
	if code := run(context.Background(), []string{"gen", "--groups", "1", "--quiet", "--out", out}, io.Discard, &stderr); code != exitOK {
		t.Fatalf("gen --out: exit %d: %s", code, stderr.String())
	}
	if _, err := os.Stat(out); err != nil {
		t.Fatalf("gen --out wrote nothing: %v", err)
	}
	if !strings.Contains(stderr.String(), "--out has been deprecated, use --to") {
		t.Errorf("gen --out: no deprecation warning: %q", stderr.String())
	}
	if fs := commands(t)["gen"].Flags(); !fs.Lookup("out").Hidden {
		t.Error("--out shows in gen's help")
	}
}

// RLLM_PIPE_<FLAG> sets a flag; the old RLLM_<FLAG> too, with a warning;
// a flag given beats both.
func TestEnvironment(t *testing.T) {
	dir := t.TempDir()
	count := func(env map[string]string, args ...string) (int, string) {
		t.Helper()
		for k, v := range env {
			t.Setenv(k, v)
		}
		out := filepath.Join(dir, "t.jsonl")
		var stderr bytes.Buffer
		if code := run(context.Background(), append([]string{"gen", "--groups", "1", "--to", out}, args...), io.Discard, &stderr); code != exitOK {
			t.Fatalf("gen: exit %d: %s", code, stderr.String())
		}
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		trajectories := strings.Count(string(data), `"type":"trajectory"`)
		for _, k := range []string{"RLLM_PIPE_GROUP_SIZE", "RLLM_GROUP_SIZE"} {
			os.Unsetenv(k)
		}
		return trajectories, stderr.String()
	}
	if n, _ := count(nil); n != 8 {
		t.Fatalf("default: %d trajectories, want 8 (the test's premise)", n)
	}
	if n, warn := count(map[string]string{"RLLM_PIPE_GROUP_SIZE": "3"}); n != 3 || strings.Contains(warn, "deprecated") {
		t.Errorf("RLLM_PIPE_GROUP_SIZE=3: %d trajectories, stderr %q", n, warn)
	}
	if n, warn := count(map[string]string{"RLLM_GROUP_SIZE": "2"}); n != 2 || !strings.Contains(warn, "RLLM_GROUP_SIZE is deprecated, use RLLM_PIPE_GROUP_SIZE") {
		t.Errorf("RLLM_GROUP_SIZE=2: %d trajectories, stderr %q", n, warn)
	}
	if n, _ := count(map[string]string{"RLLM_PIPE_GROUP_SIZE": "3"}, "--group-size", "5"); n != 5 {
		t.Errorf("--group-size 5 with RLLM_PIPE_GROUP_SIZE=3: %d trajectories", n)
	}
	// A flag given under its old name is given: the new name's variable
	// does not override it.
	other := filepath.Join(dir, "other.jsonl")
	t.Setenv("RLLM_PIPE_TO", other)
	mine := filepath.Join(dir, "mine.jsonl")
	if code := run(context.Background(), []string{"gen", "--groups", "1", "--quiet", "--out", mine}, io.Discard, io.Discard); code != exitOK {
		t.Fatalf("gen --out with RLLM_PIPE_TO: exit %d", code)
	}
	if _, err := os.Stat(mine); err != nil {
		t.Errorf("gen --out %s with RLLM_PIPE_TO set wrote elsewhere", mine)
	}
	if _, err := os.Stat(other); err == nil {
		t.Errorf("RLLM_PIPE_TO beat --out")
	}
	// consume's --consumer-group is never taken from the environment (a
	// variable set for serve would make a peek acknowledge).
	if f := commands(t)["consume"].Flags().Lookup("consumer-group"); f == nil || f.Annotations == nil {
		t.Error("consume's --consumer-group is taken from the environment")
	}
}

// version says the release, which the Python package carries too.
func TestVersion(t *testing.T) {
	var out bytes.Buffer
	if code := run(context.Background(), []string{"version", "--json"}, &out, io.Discard); code != exitOK {
		t.Fatalf("version --json: exit %d", code)
	}
	var b cli.BuildInfo
	if err := json.Unmarshal(out.Bytes(), &b); err != nil || b.Version != cli.Version || b.Go == "" {
		t.Fatalf("version --json: %s (%v)", out.String(), err)
	}
	out.Reset()
	if code := run(context.Background(), []string{"--version"}, &out, io.Discard); code != exitOK || !strings.HasPrefix(out.String(), "rllm-pipe "+cli.Version+" (") {
		t.Errorf("--version: exit %d, %q", code, out.String())
	}
	py, err := os.ReadFile("../../train/python/rllm_pipe/__init__.py")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^__version__ = "([^"]+)"`).FindSubmatch(py)
	if m == nil || string(m[1]) != cli.Version {
		t.Errorf("the Python package's __version__ is %q, the binary's %q", m, cli.Version)
	}
}

// docs/cli.md is every command's help as it is now (make docs).
func TestCLIReference(t *testing.T) {
	clitest.CheckReference(t, newRoot(context.Background()), "rllm-pipe command reference", "../../docs/cli.md")
}
