package main

import (
	"context"
	"os"
	"strings"

	"github.com/rllm-pipe/rllm-pipe/connectors"
	"github.com/rllm-pipe/rllm-pipe/connectors/kafka"
	"github.com/rllm-pipe/rllm-pipe/connectors/pipeline"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/ingest"
)

// runFile ingests a file or stdin, with a progress bar of the input read.
func runFile(ctx, soft context.Context, pl *pipeline.Pipeline, from string, maxRecord int64, stats *ingestStats, bar func(total int64) *progress) error {
	path, err := localPath("from", from)
	if err != nil {
		return err
	}
	var src *ingest.LineSource
	stopStdin := func() {}
	if path == "-" {
		src, stopStdin, err = openStdin(int(maxRecord))
	} else {
		src, err = ingest.OpenFile(path, int(maxRecord))
	}
	if err != nil {
		return err
	}
	defer src.Close()
	total := int64(-1)
	if path != "-" {
		if info, err := os.Stat(path); err == nil {
			stats.InputBytes, total = info.Size(), info.Size()
		}
	}
	stop := bar(total).follow(src.Consumed)
	defer stop()
	if path == "-" {
		return pl.Run(ctx, soft, stoppable{src, stopStdin}, src.Stream())
	}
	return pl.Run(ctx, soft, src, src.Stream())
}

// stoppable is a source whose stop is stop.
type stoppable struct {
	*ingest.LineSource
	stop func()
}

func (s stoppable) Stop() { s.stop() }

// openOutput opens --to for this run, with the dead-letter output --dlq
// names (the store's own by default).
func openOutput(ctx context.Context, o ingestOpts, runID string) (store.Store, store.DeadLetters, error) {
	root, err := connectors.ParseRoot(o.to, o.conn.options())
	if err != nil {
		return nil, nil, usageErrorf("--to: %v", err)
	}
	isKafka := strings.HasPrefix(o.dlq, "kafka://")
	if root.S3 != nil {
		if size, _ := parseBytes(o.shardSize); size > 4<<30 {
			return nil, nil, usageErrorf("--shard-size: at most 4GiB on S3 (a shard is one create-only PUT)")
		}
		if o.dlq != "" && !isKafka {
			return nil, nil, usageErrorf("--dlq: with an s3:// output, dead letters are objects under <prefix>/_dlq/ or a kafka:// topic")
		}
	}
	var dlqPath string
	if o.dlq != "" && !isKafka {
		if dlqPath, err = localPath("dlq", o.dlq); err != nil {
			return nil, nil, err
		}
	}
	st, err := connectors.OpenStore(ctx, root, runID)
	if err != nil {
		return nil, nil, err
	}
	var dl store.DeadLetters
	switch {
	case isKafka:
		cfg, err := kafka.ParseURL(o.dlq)
		if err != nil {
			st.Close()
			return nil, nil, usageErrorf("--dlq: %v", err)
		}
		if dl, err = kafka.NewDeadLetters(ctx, o.conn.kafka(cfg)); err != nil {
			st.Close()
			return nil, nil, err
		}
	case dlqPath != "":
		dl = connectors.DeadLetterFile(root, dlqPath)
	default:
		dl = st.DeadLetters()
	}
	return st, dl, nil
}
