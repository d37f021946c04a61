package main

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

func TestBounds(t *testing.T) {
	rep := func(kafkaWall, fileWall, fileCPU, broker, minio, drainWall float64) *report {
		r := &report{Wall: map[string]stat{"kafka": {Median: kafkaWall}, "file": {Median: fileWall}},
			CPU:       map[string]stat{"file": {Median: fileCPU}},
			BrokerCPU: map[string]stat{"kafka": {Median: broker}, "file": {Median: 9}}, // the file run's are not the services' cost
			MinIOCPU:  map[string]stat{"kafka": {Median: minio}}}
		if drainWall > 0 {
			r.Wall["drain"] = stat{Median: drainWall}
		}
		return r
	}
	for _, c := range []struct {
		name               string
		rep                *report
		cores              int
		floor, file, drain float64
		services, both     float64
		over               bool
	}{
		// This machine on 2026-12-03: (5.11 + 0.63 + 1.18) / 2 = 3.46 s;
		// 2.92 / 3.46, 1.53 / 3.46; (1 − 0.8) × 2 × 1.53 / 0.5 = 1.224.
		{"measured", rep(4.27, 2.92, 5.11, 0.63, 1.18, 1.53), 2, 3.46, 0.8439, 0.4422, 1.81, 1.224, true},
		// Four cores and a slow drain leave room for both.
		{"room", rep(2, 1.5, 5.6, 0.2, 0.2, 1.0), 4, 1.5, 1, 0.6667, 0.4, 1.6, false},
		{"no drain", rep(4, 3, 5, 0.5, 0.5, 0), 2, 3, 1, 0, 1, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, ok := boundsOf(c.rep, c.cores)
			if !ok {
				t.Fatal("no bounds")
			}
			for _, v := range []struct {
				what      string
				got, want float64
			}{{"floor", b.Floor, c.floor}, {"kafka/file", b.File, c.file}, {"kafka/drain", b.Drain, c.drain},
				{"services", b.Services, c.services}, {"services for both", b.BothServices, c.both}} {
				if math.Abs(v.got-v.want) > 1e-3 {
					t.Errorf("%s %.4f, want %.4f", v.what, v.got, v.want)
				}
			}
			var out bytes.Buffer
			b.print(&out, c.rep.CPU["file"].Median)
			if got := strings.Contains(out.String(), "cannot both be met"); got != c.over {
				t.Errorf("printed %q: says the aims cannot both be met: %v, want %v", out.String(), got, c.over)
			}
		})
	}
	if _, ok := boundsOf(&report{Wall: map[string]stat{"kafka": {Median: 1}}}, 2); ok {
		t.Error("bounds without a file run")
	}
}
