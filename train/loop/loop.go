// Package loop closes the training loop through the store. A trainer
// publishes the policy version its inference workers now serve (Publish:
// an object per version in a create-only folder beside its consumer
// group's log, local folders and S3 alike), and the capture gateway
// follows it (Follower) to stamp the calls it records with that version
// and to pace new rollouts by how far the consumer group has got.
//
// Whose version counts: the highest published for the consumer group.
// Data-parallel ranks that publish the same version after a step publish
// it once (the object exists: the first publication stands); a version
// lower than one already published changes nothing, so a rank that
// lags, or a trainer restarted from an older checkpoint, never moves the
// served version back (publish a higher one, or push with the gateway's
// /admin/weight_version).
package loop

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/train"
)

// Dir is the folder of published versions under the store root, one
// folder per consumer group.
const Dir = "_policy"

// VersionsDir is the folder of group's published versions.
func VersionsDir(group string) string { return Dir + "/" + group }

// Keep is how many of the newest publications Publish leaves: older ones
// are deleted, so that reading the served version costs one short list.
const Keep = 256

// Publication is one published version.
type Publication struct {
	PolicyVersion int64     `json:"policy_version"`
	By            string    `json:"by,omitempty"` // the consumer (member) that published it first
	At            time.Time `json:"published_at"`
}

const prefix = "v-"

func name(v int64) string { return fmt.Sprintf("%s%020d.json", prefix, v) }

// Publish records that version v is served, by member by, in obj (the
// group's VersionsDir). Publishing a version already published returns
// the first publication.
func Publish(ctx context.Context, obj store.Objects, v int64, by string) (Publication, error) {
	if err := train.CheckPolicyVersion(v); err != nil {
		return Publication{}, fmt.Errorf("loop: publish: %w", err)
	}
	p := Publication{PolicyVersion: v, By: by, At: time.Now().UTC()}
	data, err := json.Marshal(p)
	if err != nil {
		return Publication{}, fmt.Errorf("loop: publish: %w", err)
	}
	switch err := obj.Create(ctx, name(v), data); {
	case errors.Is(err, fs.ErrExist):
		first, err := read(ctx, obj, name(v))
		if err != nil {
			return Publication{}, err
		}
		return first, nil
	case err != nil:
		return Publication{}, fmt.Errorf("loop: publish version %d: %w", v, err)
	}
	prune(ctx, obj)
	return p, nil
}

// Publisher publishes into one group's versions folder (for serve's
// publish_policy_version action).
type Publisher struct{ Obj store.Objects }

// NewPublisher publishes for consumer group group of the store r.
func NewPublisher(r store.Reader, group string) (Publisher, error) {
	if err := train.CheckName("consumer group", group); err != nil {
		return Publisher{}, err
	}
	obj, err := r.Objects(VersionsDir(group))
	if err != nil {
		return Publisher{}, fmt.Errorf("loop: %w", err)
	}
	return Publisher{Obj: obj}, nil
}

// Publish is the package's Publish into p's folder.
func (p Publisher) Publish(ctx context.Context, v int64, by string) error {
	_, err := Publish(ctx, p.Obj, v, by)
	return err
}

// prune deletes all but the Keep newest publications. A failure only
// leaves more to list: it is not an error of the publication.
func prune(ctx context.Context, obj store.Objects) {
	names, err := obj.List(ctx, prefix)
	if err != nil || len(names) <= Keep {
		return
	}
	for _, n := range names[:len(names)-Keep] {
		if obj.Delete(ctx, n) != nil {
			return
		}
	}
}

func read(ctx context.Context, obj store.Objects, n string) (Publication, error) {
	data, err := obj.Get(ctx, n)
	if err != nil {
		return Publication{}, fmt.Errorf("loop: read %s: %w", n, err)
	}
	var p Publication
	if err := json.Unmarshal(data, &p); err != nil {
		return Publication{}, fmt.Errorf("loop: %s: %w", n, err)
	}
	return p, nil
}

// Served returns the highest published version; false when none is.
func Served(ctx context.Context, obj store.Objects) (Publication, bool, error) {
	for attempt := 0; ; attempt++ {
		names, err := obj.List(ctx, prefix)
		if err != nil {
			return Publication{}, false, fmt.Errorf("loop: list published versions: %w", err)
		}
		for i := len(names) - 1; i >= 0; i-- { // names sort by version
			if _, ok := store.ParseNumbered(names[i], prefix); !ok {
				continue
			}
			p, err := read(ctx, obj, names[i])
			if errors.Is(err, fs.ErrNotExist) && attempt < 3 {
				break // pruned meanwhile: list again
			}
			return p, err == nil, err
		}
		if len(names) == 0 || attempt >= 3 {
			return Publication{}, false, nil
		}
	}
}

// State is the trainer's side of the loop as the store shows it.
type State struct {
	// Served is the highest published version (HasServed false: none).
	Served    Publication
	HasServed bool
	// Committed counts the groups committed to the store; Consumed those
	// the consumer group acknowledged or skipped as stale.
	Committed, Consumed int64
	// Trained is the newest policy version a member of the consumer group
	// acknowledged a step with (-1: none yet).
	Trained int64
	// CommittedKeys are the keys of the groups committed since the
	// previous State (all committed groups at the first).
	CommittedKeys []string
}

// Follower reads State again and again, each time only what the manifest
// and the group's log added. Not safe for concurrent use.
type Follower struct {
	r                  store.Reader
	versions, groupObj store.Objects
	watch              train.GroupWatch
	entries            int
	committed          int64
}

// NewFollower follows consumer group group of the store r.
func NewFollower(r store.Reader, group string) (*Follower, error) {
	if err := train.CheckName("consumer group", group); err != nil {
		return nil, err
	}
	versions, err := r.Objects(VersionsDir(group))
	if err != nil {
		return nil, fmt.Errorf("loop: %w", err)
	}
	groupObj, err := r.Objects(train.GroupDir(group))
	if err != nil {
		return nil, fmt.Errorf("loop: %w", err)
	}
	return &Follower{r: r, versions: versions, groupObj: groupObj}, nil
}

// State reads the store's state now.
func (f *Follower) State(ctx context.Context) (State, error) {
	var s State
	var err error
	if s.Served, s.HasServed, err = Served(ctx, f.versions); err != nil {
		return State{}, err
	}
	entries, err := f.r.CommittedFrom(ctx, f.entries)
	if err != nil {
		return State{}, fmt.Errorf("loop: read the manifest: %w", err)
	}
	for _, e := range entries {
		f.committed += int64(e.Groups)
		s.CommittedKeys = append(s.CommittedKeys, e.GroupKeys...)
	}
	f.entries += len(entries)
	p, err := f.watch.Progress(ctx, f.groupObj)
	if err != nil {
		return State{}, err
	}
	s.Committed, s.Consumed, s.Trained = f.committed, p.GroupsAcked+p.GroupsSkip, -1
	for _, m := range p.Members {
		if m.Batches > 0 {
			s.Trained = max(s.Trained, m.PolicyVersion)
		}
	}
	return s, nil
}
