package benchkit

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"1GB", 1e9, true}, {"512MiB", 512 << 20, true}, {"1.5 kb", 1500, true}, {"100", 100, true},
		{"0", 0, false}, {"-1GB", 0, false}, {"GB", 0, false}, {"1e30TB", 0, false},
	} {
		got, err := ParseSize(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d (ok %v)", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestMedianSpread(t *testing.T) {
	if m := Median([]float64{3, 1, 2}); m != 2 {
		t.Errorf("median of 3 1 2: %v", m)
	}
	if m := Median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("median of 4 1 3 2: %v", m)
	}
	if s := Spread([]float64{3.14, 1, 2}, 1); s != "2.0 (1.0–3.1)" {
		t.Errorf("spread: %q", s)
	}
	if s := Spread(nil, 1); s != "-" {
		t.Errorf("spread of nothing: %q", s)
	}
}

func TestCountLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	data := make([]byte, 3<<20)
	for i := range data {
		if i%1000 == 999 {
			data[i] = '\n'
		} else {
			data[i] = 'x'
		}
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	n, err := CountLines(path)
	if err != nil || n != int64(len(data)/1000) {
		t.Errorf("CountLines: %d, %v; want %d", n, err, len(data)/1000)
	}
}

// TestProcessCPU: the CPU this test burns shows in the CPU time of the
// processes whose command line is this test binary's.
func TestProcessCPU(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	before := ProcessCPU(os.Args[0])
	x := 0
	for start := time.Now(); time.Since(start) < 300*time.Millisecond; {
		x++
	}
	if d := ProcessCPU(os.Args[0]) - before; d < 150*time.Millisecond || x == 0 {
		t.Errorf("%v of CPU charged for 300 ms of spinning", d)
	}
	if d := ProcessCPU("no process has this on its command line " + t.Name()); d != 0 {
		t.Errorf("%v of CPU for no process", d)
	}
}
