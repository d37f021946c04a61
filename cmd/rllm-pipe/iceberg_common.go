package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
)

// icebergTarget is where a syncer projects a root: the flags of iceberg
// sync and ingest's --iceberg-*.
type icebergTarget struct {
	catalog, name, namespace, warehouse string
	maxFiles                            int
}

// icebergTotals is what a run's syncs did in all (iceberg.Result's
// fields, summed), for ingest's summary.
type icebergTotals struct {
	Shards      int   `json:"shards"`
	Rows        int64 `json:"rows"`
	Split       int   `json:"split"`
	Commits     int   `json:"commits"`
	Conflicts   int   `json:"conflicts"`
	Position    int   `json:"position"`
	Snapshot    int64 `json:"snapshot"`
	DeadLetters int64 `json:"dead_letters"`
}

// icebergRun keeps a table in step with a running ingest (iceberg.go);
// a build without Iceberg (-tags noiceberg, whose binary starts without
// iceberg-go's package initialisation) has none.
type icebergRun interface {
	// finish stops the interval syncs and syncs once more.
	finish(ctx context.Context) (icebergTotals, error)
	// halt stops the interval syncs.
	halt()
}

// startIcebergFunc starts an icebergRun for ingest: set by iceberg.go.
var startIcebergFunc func(ctx context.Context, root connectors.Root, r store.Reader, t icebergTarget, every time.Duration, log *slog.Logger) (icebergRun, error)
