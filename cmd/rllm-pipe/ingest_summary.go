package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/rllm-pipe/rllm-pipe/connectors/pipeline"
)

// ingestStats is the run summary, printed on stderr and written by
// --stats-json.
type ingestStats struct {
	RunID          string  `json:"run_id"`
	Output         string  `json:"output"`
	DeadLetterFile string  `json:"dead_letter_file,omitempty"`
	Stopped        bool    `json:"stopped_early"`
	ElapsedSeconds float64 `json:"elapsed_seconds"`
	InputBytes     int64   `json:"input_bytes,omitempty"`
	Estimator      string  `json:"estimator"`
	Stdin          bool    `json:"-"`
	pipeline.Result
	DeadLetters      map[string]int64 `json:"dead_letters"`
	DeadLettersTotal int64            `json:"dead_letters_total"`
	// Iceberg is what --iceberg-catalog's syncs did in all.
	Iceberg      *icebergTotals `json:"iceberg,omitempty"`
	IcebergError string         `json:"iceberg_error,omitempty"`
}

func writeStatsJSON(path string, st ingestStats) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil && filepath.Dir(path) != "." {
		return fmt.Errorf("stats json: %w", err)
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func printIngestSummary(w io.Writer, st ingestStats) {
	sc := st.Totals
	c := st.Counters
	mb := float64(st.InputBytes) / (1 << 20)
	fmt.Fprintf(w, "ingest %s: %d records read", st.RunID, c.Records)
	if st.InputBytes > 0 && st.ElapsedSeconds > 0 {
		fmt.Fprintf(w, " (%.1f MiB in %.2fs, %.1f MiB/s)", mb, st.ElapsedSeconds, mb/st.ElapsedSeconds)
	}
	fmt.Fprintln(w)
	if sc.Rows == c.StepsEmitted && sc.Groups == c.GroupsEmitted {
		fmt.Fprintf(w, "  written:    %d steps, %d trajectories, %d groups (%d partial) in %d shards, %.1f MiB\n",
			c.StepsEmitted, c.TrajectoriesEmitted, c.GroupsEmitted, c.PartialGroups, sc.Shards, float64(sc.Bytes)/(1<<20))
	} else {
		// Some groups assembled were never committed: "written" counts
		// the committed rows only.
		fmt.Fprintf(w, "  written:    %d steps, %d groups in %d shards, %.1f MiB (committed)\n",
			sc.Rows, sc.Groups, sc.Shards, float64(sc.Bytes)/(1<<20))
		fmt.Fprintf(w, "  NOT written: %d steps, %d groups assembled but never committed\n",
			max(c.StepsEmitted-sc.Rows, 0), max(c.GroupsEmitted-sc.Groups, 0))
	}
	fmt.Fprintf(w, "  dropped:    %d duplicates (producer retries)\n", c.Duplicates)
	if c.SkippedCommitted > 0 {
		fmt.Fprintf(w, "  skipped:    %d records settled by an earlier run over this input\n", c.SkippedCommitted)
	}
	fmt.Fprintf(w, "  repaired:   %d records with invalid UTF-8\n", c.Repaired)
	fmt.Fprintf(w, "  advantage:  %s", st.Estimator)
	if st.NoTeacher > 0 {
		fmt.Fprintf(w, "; %d steps without teacher logprobs (token_advantages null)", st.NoTeacher)
	}
	fmt.Fprintln(w)
	if len(st.Filtered) > 0 {
		fmt.Fprintf(w, "  marked by filters (trajectories):")
		for _, k := range slices.Sorted(maps.Keys(st.Filtered)) {
			fmt.Fprintf(w, " %s %d;", k, st.Filtered[k])
		}
		fmt.Fprintln(w)
	}
	if c.TimedOut > 0 || c.Evicted > 0 {
		fmt.Fprintf(w, "  closed early: %d groups timed out, %d evicted at --max-open-groups\n", c.TimedOut, c.Evicted)
	}
	fmt.Fprintf(w, "  dead letters: %d", st.DeadLettersTotal)
	if st.DeadLettersTotal > 0 {
		fmt.Fprintf(w, " in %s", st.DeadLetterFile)
	}
	fmt.Fprintln(w)
	for _, r := range slices.Sorted(maps.Keys(st.DeadLetters)) {
		fmt.Fprintf(w, "    %-22s %d\n", r, st.DeadLetters[r])
	}
	if st.Spilled > 0 {
		fmt.Fprintf(w, "  NOT written: %d records read from stdin; saved as they were read in %s: ingest that file to write them\n", st.Spilled, st.SpillFile)
	}
	switch {
	case st.Spilled > 0:
	case st.Stopped && st.Drained:
		fmt.Fprintln(w, "  stopped early by a signal: stdin was read up to there, and every record read was written (open groups closed as at the end of the input)")
	case st.Stopped && st.Stdin:
		fmt.Fprintln(w, "  stopped early by a signal, with records of stdin not written (stdin cannot be read again)")
	case st.Stopped:
		fmt.Fprintln(w, "  stopped early by a signal: groups still open were not written; run again to resume")
	}
	fmt.Fprintf(w, "  output:     %s\n", st.Output)
	if st.Iceberg != nil {
		fmt.Fprintf(w, "  iceberg:    %d shards added in %d commits; the table holds %d shards", st.Iceberg.Shards, st.Iceberg.Commits, st.Iceberg.Position)
		if st.IcebergError != "" {
			fmt.Fprintf(w, " (behind: %s; iceberg sync catches it up)", st.IcebergError)
		}
		fmt.Fprintln(w)
	}
}
