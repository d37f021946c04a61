package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Version is the release of rllm-pipe: the executables and the Python
// package (train/python) carry the same one, which a test checks.
const Version = "0.1.0"

// commit is set by the Makefile's -ldflags -X (the build info's VCS stamp
// is missing where GOFLAGS has -buildvcs=false, or outside a checkout).
var commit string

// BuildInfo says which build is running.
type BuildInfo struct {
	Version string `json:"version"`
	// Commit is the VCS revision the binary was built from ("+dirty" when
	// the tree had changes; "unknown" when the build recorded none).
	Commit    string `json:"commit"`
	Go        string `json:"go"`
	Platform  string `json:"platform"`
	Module    string `json:"module"`
	BuildTime string `json:"commit_time,omitempty"`
}

// Build returns the running executable's BuildInfo.
func Build() BuildInfo {
	b := BuildInfo{Version: Version, Commit: "unknown", Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		if commit != "" {
			b.Commit = commit
		}
		return b
	}
	b.Module = info.Main.Path
	dirty := false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Commit = s.Value
		case "vcs.time":
			b.BuildTime = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && b.Commit != "unknown" {
		b.Commit += "+dirty"
	}
	if commit != "" {
		b.Commit = commit
	}
	return b
}

// String is the one-line form: "name 0.1.0 (commit 1a2b3c4d5e6f, go1.26.8, linux/amd64)".
func (b BuildInfo) String(name string) string {
	c := b.Commit
	if len(c) > 12 && c != "unknown" {
		if n := len(c) - len("+dirty"); n > 12 && c[n:] == "+dirty" {
			c = c[:12] + "+dirty"
		} else {
			c = c[:12]
		}
	}
	return fmt.Sprintf("%s %s (commit %s, %s, %s)", name, b.Version, c, b.Go, b.Platform)
}

// AddVersion gives root a version command and a --version flag, which
// print name's version.
func AddVersion(root *cobra.Command, name string) {
	root.Version = Build().String(name)
	root.SetVersionTemplate("{{.Version}}\n")
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "version",
		Short:   "Print the version, commit and Go version of this build",
		Example: "  " + root.CommandPath() + " version\n  " + root.CommandPath() + " version --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return printVersion(cmd.OutOrStdout(), name, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON object (version, commit, go, platform, module)")
	root.AddCommand(cmd)
}

func printVersion(w io.Writer, name string, asJSON bool) error {
	b := Build()
	if asJSON {
		return json.NewEncoder(w).Encode(b)
	}
	_, err := fmt.Fprintln(w, b.String(name))
	return err
}
