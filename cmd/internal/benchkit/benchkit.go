// Package benchkit holds what the benchmark drivers under cmd/
// (ingestbench, kafkabench, scalebench) share: sizes, line counts, the
// machine's busy CPU time, and medians with their spread.
package benchkit

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ParseSize reads a size such as 1GB, 512MiB or 1e9 (bytes).
func ParseSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	units := []struct {
		suffix string
		mult   float64
	}{
		{"KIB", 1 << 10}, {"MIB", 1 << 20}, {"GIB", 1 << 30}, {"TIB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"B", 1},
	}
	mult := 1.0
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v <= 0 || math.IsInf(v*mult, 0) || v*mult > math.MaxInt64 {
		return 0, fmt.Errorf("bad size %q: want a number and B, KB, MB, GB, KiB, MiB or GiB", s)
	}
	return int64(v * mult), nil
}

// CountLines counts the newlines of the file at path.
func CountLines(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var n int64
	buf := make([]byte, 1<<20)
	for {
		k, err := f.Read(buf)
		n += int64(bytes.Count(buf[:k], []byte("\n")))
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return 0, err
		}
	}
}

// clockTicks is USER_HZ, the unit of /proc/stat: 100 on every Linux
// platform Go supports.
const clockTicks = 100

// MachineBusy is the busy CPU time of all cores since boot (user, nice,
// system, irq, softirq, steal from /proc/stat; guest time is already in
// user), or false where there is no /proc/stat.
func MachineBusy() (time.Duration, bool) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, false
	}
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, false
		}
		busy += v
	}
	return time.Duration(busy) * time.Second / clockTicks, true
}

// Median is the median of xs (0 when empty).
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Spread is "median (min–max)" of xs with prec decimals ("-" when empty).
func Spread(xs []float64, prec int) string {
	if len(xs) == 0 {
		return "-"
	}
	lo, hi := slices.Min(xs), slices.Max(xs)
	return fmt.Sprintf("%.*f (%.*f–%.*f)", prec, Median(xs), prec, lo, prec, hi)
}

// ProcessCPU is the CPU time (user and system) used so far by the running
// processes whose command line contains match, from /proc/<pid>/stat; 0
// where there is no /proc. The drivers take it before and after a run to
// charge the services (the Kafka broker, MinIO) their share of it.
func ProcessCPU(match string) time.Duration {
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var ticks int64
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		if err != nil || !strings.Contains(strings.ReplaceAll(string(cmd), "\x00", " "), match) {
			continue
		}
		stat, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			continue
		}
		// The fields after the command name, which is in parentheses and
		// may hold spaces: utime and stime are the 12th and 13th of them.
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + s
	}
	return time.Duration(ticks) * time.Second / clockTicks
}
