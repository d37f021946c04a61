// Package cli holds what the executables under cmd/ (rllm-pipe and
// rllm-pipe-iceberg) share about running as a command: exit codes, the
// two-signal stop, flags from the environment, and the S3 connection
// flags.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/rllm-pipe/rllm-pipe/connectors"
	"github.com/rllm-pipe/rllm-pipe/connectors/s3"
	"github.com/rllm-pipe/rllm-pipe/connectors/termtext"
)

// Exit codes: 0 also after a clean stop (the first signal: everything
// read was committed, or is left to a rerun that reads it again).
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitUsage   = 2
	// ExitStopped: a signal stopped the command before it could finish
	// cleanly (a second signal, or a first one while a store or broker was
	// unreachable): what was committed is whole, a rerun resumes the rest.
	ExitStopped = 3
)

// ExitError carries an exit code through cobra.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// UsageErrorf is an error of the command line: exit code ExitUsage.
func UsageErrorf(format string, args ...any) error {
	return &ExitError{Code: ExitUsage, Err: fmt.Errorf(format, args...)}
}

// AbortGrace is how long a second signal waits for the command to end
// before the process exits anyway (long enough for an aborted stdin run
// to write its spill file).
const AbortGrace = time.Minute

// Run executes the command that newRoot builds with args and returns the
// exit code. The first SIGINT or SIGTERM cancels soft (newRoot's
// argument: stop reading, finish what is in hand); a second one cancels
// the command's context at once. name prefixes what Run prints.
func Run(ctx context.Context, name string, newRoot func(soft context.Context) *cobra.Command, args []string, stdout, stderr io.Writer) int {
	hard, cancelHard := context.WithCancel(ctx)
	defer cancelHard()
	soft, cancelSoft := context.WithCancel(hard)
	defer cancelSoft()
	returned := make(chan struct{})
	defer close(returned)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		select {
		case <-sigs:
		case <-hard.Done():
			return
		}
		fmt.Fprintf(stderr, "%s: stopping cleanly: finishing what is in hand (signal again to abort)\n", name)
		cancelSoft()
		select {
		case <-sigs:
			fmt.Fprintf(stderr, "%s: aborting\n", name)
			cancelHard()
		case <-hard.Done():
			return
		}
		// Every command ends soon after the abort; one that does not (a
		// call blocked where nothing interrupts it) is not waited for:
		// what was committed is whole wherever a run stops.
		select {
		case <-time.After(AbortGrace):
			fmt.Fprintf(stderr, "%s: still running %s after the abort; exiting\n", name, AbortGrace)
			os.Exit(ExitStopped)
		case <-returned:
		}
	}()

	MigrateEnv(stderr, name)
	root := newRoot(soft)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	flagsTo(root, stderr)
	err := root.ExecuteContext(hard)
	if err == nil {
		return ExitOK
	}
	// An error may quote data (a record id in a DuckDB error, a path):
	// control characters are escaped, so none reaches the terminal.
	fmt.Fprintf(stderr, "%s: %s\n", name, termtext.EscapeKeepLines(err.Error()))
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	if soft.Err() != nil {
		fmt.Fprintf(stderr, "%s: stopped before finishing: what was committed is whole; run again to resume\n", name)
		return ExitStopped
	}
	if strings.HasPrefix(err.Error(), "unknown command") || strings.HasPrefix(err.Error(), "unknown flag") ||
		strings.Contains(err.Error(), "flag needs an argument") || strings.Contains(err.Error(), "invalid argument") ||
		strings.Contains(err.Error(), "required flag") {
		return ExitUsage
	}
	return ExitFailure
}

// noEnv annotates a flag that is never taken from the environment
// (NoEnv).
const noEnv = "rllm-pipe/no-env"

// NoEnv keeps flag name of f from the environment: a variable set for
// other commands must not change what this one does (consume's
// --consumer-group: RLLM_PIPE_CONSUMER_GROUP, set for serve, would turn
// its read-only peek into a member that acknowledges).
func NoEnv(f *pflag.FlagSet, name string) {
	_ = f.SetAnnotation(name, noEnv, []string{"true"})
}

// EnvPrefix prefixes every environment variable the executables read:
// RLLM_PIPE_<FLAG> sets --<flag> (RLLM_PIPE_GROUP_SIZE sets --group-size).
const EnvPrefix = "RLLM_PIPE_"

// oldPrefix is the prefix of flags' variables before EnvPrefix; they are
// still read, with a warning, for one release.
const oldPrefix = "RLLM_"

// renamedEnv are the variables other than flags' that were renamed, old
// name to new: MigrateEnv moves them.
var renamedEnv = map[string]string{
	"RLLM_GATEWAY_AGENT_TOKEN":  "RLLM_PIPE_GATEWAY_AGENT_TOKEN",
	"RLLM_GATEWAY_ADMIN_TOKEN":  "RLLM_PIPE_GATEWAY_ADMIN_TOKEN",
	"RLLM_KAFKA_TLS":            "RLLM_PIPE_KAFKA_TLS",
	"RLLM_KAFKA_SASL_MECHANISM": "RLLM_PIPE_KAFKA_SASL_MECHANISM",
	"RLLM_KAFKA_SASL_USERNAME":  "RLLM_PIPE_KAFKA_SASL_USERNAME",
	"RLLM_KAFKA_SASL_PASSWORD":  "RLLM_PIPE_KAFKA_SASL_PASSWORD",
}

// MigrateEnv gives every renamed variable that is set under its old name
// only its new name too, warning on w once per variable; the process
// then reads only the new names (and its children inherit them).
func MigrateEnv(w io.Writer, name string) {
	olds := make([]string, 0, len(renamedEnv))
	for o := range renamedEnv {
		olds = append(olds, o)
	}
	sort.Strings(olds)
	for _, o := range olds {
		v, ok := os.LookupEnv(o)
		if !ok {
			continue
		}
		n := renamedEnv[o]
		if _, set := os.LookupEnv(n); !set {
			_ = os.Setenv(n, v)
		}
		// Only the new name goes on, so a child executable (rllm-pipe
		// iceberg) does not warn again.
		_ = os.Unsetenv(o)
		fmt.Fprintf(w, "%s: warning: %s is deprecated, use %s\n", name, o, n)
	}
}

// ApplyEnv sets every flag of cmd not given on the command line from its
// RLLM_PIPE_* variable (--group-size from RLLM_PIPE_GROUP_SIZE): flag
// beats environment beats default. The RLLM_* name of earlier versions is
// still read when the new one is not set, with a warning.
func ApplyEnv(cmd *cobra.Command) error {
	fs := cmd.Flags()
	// A flag given under any of its names (a renamed flag's old one
	// shares its value) is not taken from the environment; old names
	// have no variables of their own.
	given := map[pflag.Value]bool{}
	fs.Visit(func(f *pflag.Flag) { given[f.Value] = true })
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || given[f.Value] || f.Deprecated != "" || f.Name == "help" || f.Name == "version" || f.Annotations[noEnv] != nil {
			return
		}
		suffix := strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		name := EnvPrefix + suffix
		v, ok := os.LookupEnv(name)
		if !ok {
			old := oldPrefix + suffix
			if v, ok = os.LookupEnv(old); ok {
				fmt.Fprintf(cmd.ErrOrStderr(), "%s: warning: %s is deprecated, use %s\n", cmd.Root().Name(), old, name)
				name = old
			}
		}
		if ok {
			if serr := fs.Set(f.Name, v); serr != nil {
				err = UsageErrorf("%s: %v", name, serr)
			}
		}
	})
	return err
}

// S3Flags are the S3 connection settings that may come from flags; keys
// come only from the environment (a flag would show in the process list).
type S3Flags struct {
	Endpoint string
	Region   string
	RetryFor time.Duration
}

// Register adds --s3-endpoint, --s3-region and --retry-for to f.
func (c *S3Flags) Register(f *pflag.FlagSet) {
	f.StringVar(&c.Endpoint, "s3-endpoint", "", "S3 endpoint URL (default AWS_ENDPOINT_URL; keys from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)")
	f.StringVar(&c.Region, "s3-region", "", "S3 region (default AWS_REGION, else us-east-1)")
	c.RegisterRetry(f)
}

// RegisterRetry adds --retry-for alone (a command that reaches no store
// but Kafka).
func (c *S3Flags) RegisterRetry(f *pflag.FlagSet) {
	f.DurationVar(&c.RetryFor, "retry-for", s3.DefaultRetryFor, "how long an unreachable S3 or Kafka is retried before the command fails (a first signal stops retrying at once)")
}

// Check validates the settings.
func (c *S3Flags) Check() error {
	if c.RetryFor <= 0 {
		return UsageErrorf("--retry-for: must be positive, not %s", c.RetryFor)
	}
	return nil
}

// Options are the settings as connectors take them.
func (c *S3Flags) Options() connectors.Options {
	return connectors.Options{S3Endpoint: c.Endpoint, S3Region: c.Region, RetryFor: c.RetryFor}
}

// Args are the flags that give these settings to another rllm-pipe
// executable.
func (c *S3Flags) Args() []string {
	a := []string{"--retry-for", c.RetryFor.String()}
	if c.Endpoint != "" {
		a = append(a, "--s3-endpoint", c.Endpoint)
	}
	if c.Region != "" {
		a = append(a, "--s3-region", c.Region)
	}
	return a
}

// ParseBytes reads sizes such as 256MiB, 64MB, 1GiB or 1048576.
func ParseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("size %q: want a positive whole number with an optional unit (KiB, MiB, GiB)", s)
	}
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("size %q: too large", s)
	}
	return n * mult, nil
}

// Globals are the flags every command takes.
type Globals struct {
	Quiet     bool
	LogFormat string
}

// Register adds --quiet and --log-format to root's persistent flags. A
// command that defines its own --quiet or --log-format (to say what its
// quiet leaves out) shadows the global one; Prepare reads whichever the
// command has.
func (g *Globals) Register(root *cobra.Command) {
	f := root.PersistentFlags()
	f.BoolVar(&g.Quiet, "quiet", false, "print only warnings and errors on stderr (no progress or summary)")
	f.StringVar(&g.LogFormat, "log-format", "text", "log format on stderr: text or json")
}

// Prepare runs before every command: flags from the environment, then the
// default logger from --log-format and --quiet.
func Prepare(cmd *cobra.Command) error {
	if err := ApplyEnv(cmd); err != nil {
		return err
	}
	format, quiet := "text", false
	if f := cmd.Flags().Lookup("log-format"); f != nil {
		format = f.Value.String()
	}
	if f := cmd.Flags().Lookup("quiet"); f != nil {
		quiet = f.Value.String() == "true"
	}
	log, err := Logger(cmd.ErrOrStderr(), format, quiet)
	if err != nil {
		return err
	}
	slog.SetDefault(log)
	return nil
}

// Logger is the structured logger on w of --log-format (text or json)
// and --quiet (warnings and errors only).
func Logger(w io.Writer, format string, quiet bool) (*slog.Logger, error) {
	level := slog.LevelInfo
	if quiet {
		level = slog.LevelWarn
	}
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, UsageErrorf("--log-format: want text or json, not %q", format)
}

// Rename keeps old working as a hidden, deprecated alias of the flag now
// called name (one release): it sets the same value, and using it prints
// a warning that names the new flag. (Flags().Changed(name) does not see
// a value given through old: a renamed flag's command must not ask it.)
func Rename(f *pflag.FlagSet, old, name string) {
	nf := f.Lookup(name)
	if nf == nil {
		panic("cli.Rename: no flag --" + name)
	}
	f.AddFlag(&pflag.Flag{Name: old, Usage: "deprecated: use --" + name, Value: nf.Value, DefValue: nf.DefValue, NoOptDefVal: nf.NoOptDefVal})
	_ = f.MarkDeprecated(old, "use --"+name)
}

// flagsTo sends what the flag parser prints (a deprecated flag's
// warning) to w, for c and every command under it.
func flagsTo(c *cobra.Command, w io.Writer) {
	c.Flags().SetOutput(w)
	c.PersistentFlags().SetOutput(w)
	for _, sub := range c.Commands() {
		flagsTo(sub, w)
	}
}
