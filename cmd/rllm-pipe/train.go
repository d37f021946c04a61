package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/rllm-pipe/rllm-pipe/advantage"
	"github.com/rllm-pipe/rllm-pipe/connectors"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/train"
	trainflight "github.com/rllm-pipe/rllm-pipe/train/flight"
)

// trainOpts are the flags serve and consume share: where the shards are,
// the consumer group, and what the trainer accepts.
type trainOpts struct {
	from            string
	group, name     string
	policyVersion   int64
	maxStaleness    int64
	maxTokens       int64
	includeFiltered bool
	batchEstimator  string
	compat          string
	leaseTimeout    time.Duration
	maxInflight     int
	follow          bool
	poll            time.Duration
	conn            connFlags
}

func (o *trainOpts) register(f *pflag.FlagSet, follow bool) {
	f.StringVar(&o.from, "from", "", "committed shards: an ingest output root (path, file:///path) or s3://bucket/prefix")
	f.StringVar(&o.group, "consumer-group", "default", "consumer group: members share the shards, each group is delivered and acknowledged once per group")
	f.Int64Var(&o.policyVersion, "policy-version", 0, "the trainer's current policy version (updatable through the API)")
	f.Int64Var(&o.maxStaleness, "max-staleness", -1, "skip groups more than this many versions behind --policy-version (-1: no bound)")
	f.Int64Var(&o.maxTokens, "max-tokens", 0, "token budget of a batch, prompt and response tokens (0: one group per batch)")
	f.BoolVar(&o.includeFiltered, "include-filtered", false, "deliver rows a filter marked (filter_reason)")
	f.StringVar(&o.batchEstimator, "batch-estimator", "", "recompute advantage over each batch: reinforce_plus_plus_baseline, prpo, batch_std")
	f.StringVar(&o.compat, "compat", "rllm", "numerical conventions of --batch-estimator: rllm, verl, trl")
	f.DurationVar(&o.leaseTimeout, "lease-timeout", 30*time.Second, "a crashed member's shards go to another member after this")
	f.IntVar(&o.maxInflight, "max-inflight", 4, "batches per member delivered and not yet acknowledged, at most")
	f.BoolVar(&o.follow, "follow", follow, "keep following the manifest for new shards (else stop when every committed shard is done)")
	f.DurationVar(&o.poll, "poll", time.Second, "re-read the manifest this often when idle")
	o.conn.register(f)
}

// config is the consumer configuration for member name.
func (o *trainOpts) config(name string) (train.ConsumerConfig, error) {
	cfg := train.ConsumerConfig{
		Config: train.Config{
			PolicyVersion: o.policyVersion, MaxStaleness: o.maxStaleness, MaxTokens: o.maxTokens,
			IncludeFiltered: o.includeFiltered,
		},
		Name: name, LeaseTimeout: o.leaseTimeout, MaxInflight: o.maxInflight, Follow: o.follow, Poll: o.poll,
	}
	if o.batchEstimator != "" {
		compat, err := advantage.CompatByName(o.compat)
		if err != nil {
			return cfg, usageErrorf("--compat: %v", err)
		}
		if cfg.Batch, err = advantage.NewBatch(o.batchEstimator, advantage.Options{Compat: compat}); err != nil {
			return cfg, usageErrorf("--batch-estimator: %v", err)
		}
	}
	return cfg, nil
}

// openShards opens --from for reading.
func (o *trainOpts) openShards(ctx context.Context) (store.Reader, error) {
	if err := train.CheckName("--consumer-group", o.group); err != nil {
		return nil, usageErrorf("%v", err)
	}
	return openShardStore(ctx, o.from, o.conn)
}

// openShardStore opens the committed shards at from (an output root or
// s3://bucket/prefix) for reading; nothing is written there but consumer
// groups' logs.
func openShardStore(ctx context.Context, from string, conn connFlags) (store.Reader, error) {
	root, err := connectors.ParseRoot(from, conn.options())
	if err != nil {
		return nil, usageErrorf("--from: %v", err)
	}
	return connectors.OpenReader(ctx, root, "reader-"+newRunID())
}

// join makes a member of the group.
func (o *trainOpts) join(ctx context.Context, st store.Reader, name string, policyVersion *int64) (*train.Consumer, error) {
	cfg, err := o.config(name)
	if err != nil {
		return nil, err
	}
	if policyVersion != nil {
		cfg.PolicyVersion = *policyVersion
	}
	obj, err := st.Objects(train.GroupDir(o.group))
	if err != nil {
		return nil, err
	}
	return train.NewConsumer(ctx, st, obj, cfg)
}

func defaultMemberName() string {
	host, _ := os.Hostname()
	name := fmt.Sprintf("%s-%d", host, os.Getpid())
	if train.CheckName("", name) != nil {
		name = fmt.Sprintf("member-%d", os.Getpid())
	}
	return name
}

// serveGroup joins members for the Flight server.
type serveGroup struct {
	o  *trainOpts
	st store.Reader
}

func (g serveGroup) Join(ctx context.Context, name string, pv *int64) (*train.Consumer, error) {
	return g.o.join(ctx, g.st, name, pv)
}

func newServeCmd(soft context.Context) *cobra.Command {
	var (
		o      trainOpts
		listen string
		ready  string
	)
	cmd := &cobra.Command{
		Use:   "serve --from URL",
		Short: "Stream token-budget batches of a consumer group to trainers over Arrow Flight, taking acknowledgements",
		Long: `serve is the trainer-facing endpoint: every DoGet stream is a member of
--consumer-group, receiving whole groups in batches of at most --max-tokens,
skipping groups staler than --max-staleness; trainers acknowledge batches
and report their policy version through Flight actions (ack,
set_policy_version, stats). Several serve processes, or several streams of
one, share the shards without overlap; the group's position lives in the
store, so a restart resumes after the last acknowledgement. The Python
client is train/python (package rllm_pipe).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := o.config("x"); err != nil {
				return err
			}
			st, err := o.openShards(cmd.Context())
			if err != nil {
				return err
			}
			srv := trainflight.NewServer(serveGroup{o: &o, st: st})
			return trainflight.Serve(soft, listen, srv, func(addr string) {
				slog.Info("serve: listening", "addr", addr, "from", o.from, "consumer_group", o.group)
				if ready != "" {
					_ = os.WriteFile(ready, []byte(addr+"\n"), 0o644)
				}
			})
		},
	}
	f := cmd.Flags()
	o.register(f, true)
	f.StringVar(&listen, "listen", "127.0.0.1:8815", "address to serve Arrow Flight on (host:port; port 0 picks one)")
	f.StringVar(&ready, "ready-file", "", "write the bound address to this file once listening")
	return cmd
}

// consumeLine is one batch in consume's JSON-lines output.
type consumeLine struct {
	BatchID   uint64   `json:"batch_id"`
	Groups    []string `json:"groups"`
	Rows      int64    `json:"rows"`
	Tokens    int64    `json:"tokens"`
	Oversized bool     `json:"oversized"`
}

func newConsumeCmd(soft context.Context) *cobra.Command {
	var (
		o          trainOpts
		format     string
		out        string
		maxBatches int
		noAck      bool
		statsJSON  string
	)
	cmd := &cobra.Command{
		Use:   "consume --from URL",
		Short: "Print a consumer group's batches (JSON lines or an Arrow IPC stream) and acknowledge them",
		Long: `consume is one member of --consumer-group for shell use: it prints each
batch (--format jsonl: one summary line per batch; --format arrow: the
batches as an Arrow IPC stream) and acknowledges it once written. Without
--follow it stops when every committed shard is done.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "jsonl" && format != "arrow" {
				return usageErrorf("--format: jsonl or arrow")
			}
			if noAck {
				// Peeking: nothing is acknowledged, so every batch stays in
				// flight; the member must be allowed them all.
				if maxBatches <= 0 {
					return usageErrorf("--no-ack needs --max-batches")
				}
				o.maxInflight = max(o.maxInflight, maxBatches)
			}
			if o.name == "" {
				o.name = defaultMemberName()
			}
			if err := train.CheckName("--name", o.name); err != nil {
				return usageErrorf("%v", err)
			}
			st, err := o.openShards(cmd.Context())
			if err != nil {
				return err
			}
			c, err := o.join(cmd.Context(), st, o.name, nil)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if out != "" && out != "-" {
				f, err := os.Create(out)
				if err != nil {
					return err
				}
				defer f.Close()
				w = f
			}
			runErr := consumeLoop(soft, c, w, format, maxBatches, !noAck)
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			closeErr := c.Close(cctx)
			stats := c.Stats()
			fmt.Fprintf(cmd.ErrOrStderr(), "consume: %d batches, %d groups acknowledged, %d lost, %d stale and %d empty skipped, %d filtered rows, %d oversized, %d shards taken over\n",
				stats.Batches, stats.GroupsAcked, stats.GroupsLost, stats.SkippedStale, stats.SkippedEmpty, stats.SkippedFiltered, stats.Oversized, stats.Takeovers)
			if statsJSON != "" {
				data, _ := json.MarshalIndent(stats, "", "  ")
				if err := os.WriteFile(statsJSON, append(data, '\n'), 0o644); err != nil {
					return err
				}
			}
			if errors.Is(runErr, context.Canceled) && soft.Err() != nil {
				runErr = nil // stopped by a signal: a clean stop
			}
			return errors.Join(runErr, closeErr)
		},
	}
	f := cmd.Flags()
	o.register(f, false)
	f.StringVar(&o.name, "name", "", "this member's stable name in the group (default host-pid); a restart under the same name resumes its shards at once")
	f.StringVar(&format, "format", "jsonl", "output: jsonl (a line per batch) or arrow (Arrow IPC stream)")
	f.StringVar(&out, "out", "-", "write to this file instead of stdout")
	f.IntVar(&maxBatches, "max-batches", 0, "stop after this many batches (0: no limit)")
	f.BoolVar(&noAck, "no-ack", false, "do not acknowledge (peek; with --max-batches)")
	f.StringVar(&statsJSON, "stats-json", "", "write the member's tallies as JSON to this file at the end")
	return cmd
}

// consumeLoop writes batches to w and acknowledges each once written and
// flushed.
func consumeLoop(ctx context.Context, c *train.Consumer, w io.Writer, format string, maxBatches int, ack bool) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	var iw *ipc.Writer
	defer func() {
		if iw != nil {
			iw.Close()
		}
		bw.Flush()
	}()
	enc := json.NewEncoder(bw)
	for n := 0; maxBatches == 0 || n < maxBatches; n++ {
		d, err := c.Next(ctx)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		line := consumeLine{BatchID: d.ID, Groups: d.Groups, Rows: d.Record.NumRows(), Tokens: d.Tokens, Oversized: d.Oversized}
		if format == "arrow" {
			if iw == nil {
				iw = ipc.NewWriter(bw, ipc.WithSchema(d.Record.Schema()))
			}
			err = iw.Write(d.Record)
		} else {
			err = enc.Encode(line)
		}
		d.Record.Release()
		if err == nil {
			err = bw.Flush()
		}
		if err != nil {
			return err
		}
		if !ack {
			continue
		}
		// Written and flushed before it is acknowledged: a crash between the
		// two delivers the batch again, never loses it.
		if _, err := c.Ack(ctx, d.ID); err != nil {
			if !errors.Is(err, train.ErrLeaseLost) {
				return err
			}
			slog.Warn("consume: acknowledgement refused; the batch goes to another member", "batch_id", d.ID, "err", err)
		}
	}
	return nil
}
