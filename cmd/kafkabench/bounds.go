package main

import (
	"fmt"
	"io"
)

// The aims of issue 19 for this benchmark: Kafka→MinIO at least aimFile
// of the file path's throughput and aimDrain of the raw drain's.
const (
	aimFile  = 0.8
	aimDrain = 0.5
)

// bounds is what the broker and MinIO, which share the machine's cores
// with the ingest, leave of the aims, whatever the Kafka path costs.
//
// A Kafka run burns the ingest's CPU plus the services' (S: the broker's
// fetches, MinIO's uploads). Were the Kafka ingest to cost no more than
// the file ingest (P CPU-s) and the run to keep every one of the C cores
// busy, it would still take (P + S) / C: Floor, and kafka/file and
// kafka/drain could be at most the file run's and the drain's wall over
// it. Both aims at once, in the same ideal (file wall P / C), need P / (P
// + S) ≥ aimFile and D·C / (P + S) ≥ aimDrain (D the drain's wall): a
// pipeline fast enough for the second is too fast for the first unless S
// ≤ (1 − aimFile)·C·D / aimDrain, BothServices, a limit that no change of
// the pipeline moves.
type bounds struct {
	Cores        int     `json:"cores"`
	DrainWall    float64 `json:"drain_wall_seconds"`         // D (0: no drain run)
	Services     float64 `json:"services_cpu_seconds"`       // S: broker + MinIO in a Kafka run, medians
	Floor        float64 `json:"kafka_floor_seconds"`        // (P + S) / C
	File         float64 `json:"kafka_file_ceiling"`         // file wall / Floor
	Drain        float64 `json:"kafka_drain_ceiling"`        // drain wall / Floor (0: no drain run)
	BothServices float64 `json:"services_cpu_for_both_aims"` // (0: no drain run)
}

// boundsOf computes the bounds from the runs' medians on cores cores;
// ok is false without both a Kafka and a file run.
func boundsOf(rep *report, cores int) (b bounds, ok bool) {
	k, kok := rep.Wall["kafka"]
	f, fok := rep.Wall["file"]
	if !kok || !fok || k.Median <= 0 || cores < 1 {
		return bounds{}, false
	}
	b.Cores = cores
	b.Services = rep.BrokerCPU["kafka"].Median + rep.MinIOCPU["kafka"].Median
	b.Floor = (rep.CPU["file"].Median + b.Services) / float64(cores)
	b.File = f.Median / b.Floor
	if d, ok := rep.Wall["drain"]; ok && d.Median > 0 {
		b.DrainWall = d.Median
		b.Drain = d.Median / b.Floor
		b.BothServices = (1 - aimFile) * float64(cores) * d.Median / aimDrain
	}
	return b, true
}

func (b bounds) print(w io.Writer, fileCPU float64) {
	fmt.Fprintf(w, "what the services leave (the broker and MinIO used %.2f CPU-s in a Kafka run; %d cores):\n", b.Services, b.Cores)
	drain := ""
	if b.Drain > 0 {
		drain = fmt.Sprintf(", kafka/drain ≤ %.2f", b.Drain)
	}
	fmt.Fprintf(w, "  a Kafka ingest costing no more CPU than the file ingest (%.2f s), every core busy: at least (%.2f + %.2f) / %d = %.2f s, so kafka/file ≤ %.2f%s\n",
		fileCPU, fileCPU, b.Services, b.Cores, b.Floor, b.File, drain)
	if b.BothServices > 0 {
		verdict := "within it"
		if b.Services > b.BothServices {
			verdict = "over it: the two aims cannot both be met on this machine, whatever the pipeline costs"
		}
		fmt.Fprintf(w, "  kafka/file ≥ %.1f with kafka/drain ≥ %.1f needs the services under (1 − %.1f) × %d × %.2f s / %.1f = %.2f CPU-s: %.2f is %s\n",
			aimFile, aimDrain, aimFile, b.Cores, b.DrainWall, aimDrain, b.BothServices, b.Services, verdict)
	}
}
