package main

import (
	"context"
	"fmt"
	"os"
	"time"

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
	from             string
	group, name      string
	policyVersion    int64
	maxStaleness     int64
	maxVersionLead   int64
	maxTokens        int64
	includeFiltered  bool
	batchEstimator   string
	compat           string
	layout           string
	leaseTimeout     time.Duration
	maxInflight      int
	versionsPerBatch int64
	batchGroups      int
	groupMultiple    int
	requireSampling  string
	batchWait        time.Duration
	follow           bool
	poll             time.Duration
	cpuProfile       string
	conn             connFlags
	// readOnly: join --consumer-group as of now but write nothing to it
	// (consume --no-ack): the member's events stay in memory.
	readOnly bool
}

// register adds the trainer's flags; group is --consumer-group's default
// ("" for a peek).
func (o *trainOpts) register(f *pflag.FlagSet, follow bool, group string) {
	f.StringVar(&o.from, "from", "", "committed shards: an ingest output root (path, file:///path) or s3://bucket/prefix")
	usage := "consumer group: members share the shards, each group is delivered and acknowledged once per group"
	if group == "" {
		usage += " (none: peek, acknowledging nothing and writing nothing to the store)"
	}
	f.StringVar(&o.group, "consumer-group", group, usage)
	f.Int64Var(&o.policyVersion, "policy-version", 0, "the trainer's current policy version (updatable through the API)")
	f.Int64Var(&o.maxStaleness, "max-staleness", -1, "skip groups more than this many versions behind --policy-version (-1: no bound)")
	f.Int64Var(&o.maxVersionLead, "max-version-lead", train.DefaultMaxVersionLead, "staleness is judged against the member's policy version capped at the newest committed group version plus this lead, so that a member far ahead (or lying) cannot pass the group's data over as stale (-1: no cap)")
	f.Int64Var(&o.maxTokens, "max-tokens", 0, "token budget of a batch, prompt and response tokens (0: one group per batch); with --batch-groups a cap that splits a step into several batches of whole groups")
	f.BoolVar(&o.includeFiltered, "include-filtered", false, "deliver rows a filter marked (filter_reason)")
	f.StringVar(&o.requireSampling, "require-sampling", "", "skip (and count) groups with a step not sampled so: key=value[,...] against the step's recorded sampling (metadata.sampling: the request's temperature, top_p, top_k, ..., the engine's logprobs_mode), e.g. temperature=1,logprobs_mode=raw_logprobs")
	f.StringVar(&o.batchEstimator, "batch-estimator", "", "recompute advantage over each batch: reinforce_plus_plus_baseline, prpo, batch_std")
	f.StringVar(&o.compat, "compat", "rllm", "numerical conventions of --batch-estimator: rllm, verl, trl")
	f.StringVar(&o.layout, "layout", "steps", "rows of a batch: steps (one per step, the shard schema) or trajectories (the steps of a trajectory that extend each other merged into one row, as rLLM's verl backend trains on; --max-tokens counts merged rows)")
	f.DurationVar(&o.leaseTimeout, "lease-timeout", 30*time.Second, "a crashed member's shards go to another member after this")
	f.IntVar(&o.batchGroups, "batch-groups", 0, "every trainer step exactly this many groups, waiting for them; short only at the end of the input or after --batch-wait, counted; a trainer's ticket may ask for its own (0: batches by --max-tokens)")
	f.IntVar(&o.groupMultiple, "group-multiple", 0, "every batch a multiple of this many groups (the data-parallel world size); the rest waits for the next batch (0: any number)")
	f.DurationVar(&o.batchWait, "batch-wait", 0, "with --batch-groups or --group-multiple, deliver the groups there are once the first has waited this long, short (0: wait for all of them)")
	f.IntVar(&o.maxInflight, "max-inflight", 4, "batches per member delivered and not yet acknowledged, at most")
	f.Int64Var(&o.versionsPerBatch, "versions-per-batch", train.DefaultVersionsPerBatch, "how far a trainer's policy version advances with each batch it acknowledges: --max-staleness is judged at the version a batch will be trained with, counting the batches delivered ahead of it (0: its version never moves with its acknowledgements)")
	f.BoolVar(&o.follow, "follow", follow, "keep following the manifest for new shards (else stop when every committed shard is done)")
	f.DurationVar(&o.poll, "poll", time.Second, "re-read the manifest this often when idle")
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof)")
	o.conn.register(f)
}

// config is the consumer configuration for member name.
func (o *trainOpts) config(name string) (train.ConsumerConfig, error) {
	if err := train.CheckPolicyVersion(o.policyVersion); err != nil {
		return train.ConsumerConfig{}, usageErrorf("--policy-version: %v", err)
	}
	if o.maxStaleness < -1 || o.maxStaleness > train.MaxPolicyVersion {
		return train.ConsumerConfig{}, usageErrorf("--max-staleness: %d out of range [-1, 2^53]", o.maxStaleness)
	}
	// Out-of-range values were replaced by the defaults before, silently.
	if err := firstErr(
		int64In("max-tokens", o.maxTokens, 0, 1<<40), intIn("max-inflight", o.maxInflight, 1, 1<<16),
		durationIn("lease-timeout", o.leaseTimeout, time.Second, 24*time.Hour), durationIn("poll", o.poll, time.Millisecond, time.Hour),
	); err != nil {
		return train.ConsumerConfig{}, err
	}
	if err := firstErr(int64In("versions-per-batch", o.versionsPerBatch, 0, 1<<20), intIn("batch-groups", o.batchGroups, 0, maxBatchGroups),
		intIn("group-multiple", o.groupMultiple, 0, maxBatchGroups), durationIn("batch-wait", o.batchWait, 0, 24*time.Hour)); err != nil {
		return train.ConsumerConfig{}, err
	}
	if err := train.CheckBatchGroups(o.batchGroups, o.groupMultiple); err != nil {
		return train.ConsumerConfig{}, usageErrorf("--batch-groups, --group-multiple: %v", err)
	}
	sampling, err := train.ParseSamplingRequirement(o.requireSampling)
	if err != nil {
		return train.ConsumerConfig{}, usageErrorf("--require-sampling: %v", err)
	}
	vpb := o.versionsPerBatch
	if vpb == 0 {
		vpb = train.NoVersionAdvance
	}
	if o.maxVersionLead == 0 || o.maxVersionLead < -1 || o.maxVersionLead > train.MaxPolicyVersion {
		return train.ConsumerConfig{}, usageErrorf("--max-version-lead: %d, want -1 (no cap) or 1 to 2^53", o.maxVersionLead)
	}
	cfg := train.ConsumerConfig{
		MaxVersionLead: o.maxVersionLead, VersionsPerBatch: vpb,
		Config: train.Config{
			PolicyVersion: o.policyVersion, MaxStaleness: o.maxStaleness, MaxTokens: o.maxTokens, BatchGroups: o.batchGroups, BatchWait: o.batchWait,
			GroupMultiple:   o.groupMultiple,
			IncludeFiltered: o.includeFiltered, RequireSampling: sampling,
		},
		Name: name, LeaseTimeout: o.leaseTimeout, MaxInflight: o.maxInflight, Follow: o.follow, Poll: o.poll,
	}
	layout, err := train.ParseLayout(o.layout)
	if err != nil {
		return cfg, usageErrorf("--layout: %v", err)
	}
	cfg.Layout = layout
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
	if err := o.checkGroup(); err != nil {
		return nil, err
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
// maxBatchGroups bounds --batch-groups and --group-multiple.
const maxBatchGroups = 1 << 20

// memberAsk is what a member asks for (a Flight ticket's), over the
// flags: its policy version (nil: --policy-version), its groups per step
// (0: --batch-groups), its versions per step (nil: --versions-per-batch).
type memberAsk struct {
	policyVersion   *int64
	batchGroups     int
	versionsPerStep *int64
}

// join makes member name's consumer, with what it asked for.
func (o *trainOpts) join(ctx context.Context, st store.Reader, name string, ask memberAsk) (*train.Consumer, error) {
	return o.joinOn(ctx, st, name, ask, nil)
}

// joinOn joins member name; with log, on the group's log this process's
// other members share.
func (o *trainOpts) joinOn(ctx context.Context, st store.Reader, name string, ask memberAsk, log *train.GroupLog) (*train.Consumer, error) {
	cfg, err := o.config(name)
	if err != nil {
		return nil, err
	}
	cfg.Log = log
	if ask.policyVersion != nil {
		cfg.PolicyVersion = *ask.policyVersion
	}
	if ask.batchGroups != 0 {
		if err := firstErr(intIn("batch_groups", ask.batchGroups, 1, maxBatchGroups), train.CheckBatchGroups(ask.batchGroups, cfg.GroupMultiple)); err != nil {
			return nil, fmt.Errorf("%w: %v", trainflight.ErrTicket, err)
		}
		cfg.BatchGroups = ask.batchGroups
	}
	if v := ask.versionsPerStep; v != nil {
		if err := int64In("versions_per_step", *v, 0, 1<<20); err != nil {
			return nil, fmt.Errorf("%w: %v", trainflight.ErrTicket, err)
		}
		cfg.VersionsPerBatch = *v
		if *v == 0 {
			cfg.VersionsPerBatch = train.NoVersionAdvance
		}
	}
	if o.peek() {
		// A private group in memory: the store is only read, and the
		// batches are numbered from 1 so that every peek prints the same.
		cfg.CountedIDs, cfg.Log = true, nil
		return train.NewConsumer(ctx, st, store.NewMemObjects(), cfg)
	}
	obj, err := st.Objects(train.GroupDir(o.group))
	if err != nil {
		return nil, err
	}
	if o.readOnly {
		cfg.CountedIDs, cfg.Log = true, nil
		peek, err := store.NewOverlay(ctx, obj)
		if err != nil {
			return nil, err
		}
		return train.NewConsumer(ctx, st, peek, cfg)
	}
	return train.NewConsumer(ctx, st, obj, cfg)
}

// peek: no consumer group was named (consume only): the member's group
// log lives in memory, so a run acknowledges nothing in the store and
// every run delivers the same batches.
func (o *trainOpts) peek() bool { return o.group == "" }

func (o *trainOpts) checkGroup() error {
	if o.peek() {
		return nil
	}
	if err := train.CheckName("--consumer-group", o.group); err != nil {
		return usageErrorf("%v", err)
	}
	return nil
}

func defaultMemberName() string {
	host, _ := os.Hostname()
	name := fmt.Sprintf("%s-%d", host, os.Getpid())
	if train.CheckName("", name) != nil {
		name = fmt.Sprintf("member-%d", os.Getpid())
	}
	return name
}
