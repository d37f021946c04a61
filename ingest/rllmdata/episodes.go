package rllmdata

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// episodeJSON is an rLLM Episode as saved by `rllm eval`
// (rllm.types.Episode, model_dump) or Episode.to_dict (rllm.agents.agent).
type episodeJSON struct {
	ID                string            `json:"id"`
	Task              json.RawMessage   `json:"task"`
	TerminationReason json.RawMessage   `json:"termination_reason"`
	IsCorrect         *bool             `json:"is_correct"`
	Trajectories      []json.RawMessage `json:"trajectories"`
	EvalIdx           *int64            `json:"eval_idx"`
	SessionID         string            `json:"session_id"`
}

type trajectoryJSON struct {
	UID     string             `json:"uid"`
	Name    string             `json:"name"`
	Steps   []json.RawMessage  `json:"steps"`
	Reward  *float64           `json:"reward"`
	Signals map[string]float64 `json:"signals"`
}

type modelOutputJSON struct {
	PromptIDs     json.RawMessage `json:"prompt_ids"`
	CompletionIDs json.RawMessage `json:"completion_ids"`
	Logprobs      json.RawMessage `json:"logprobs"`
	FinishReason  string          `json:"finish_reason"`
	WeightVersion *int64          `json:"weight_version"`
}

type stepJSON struct {
	ID              json.RawMessage  `json:"id"`
	PromptIDs       json.RawMessage  `json:"prompt_ids"`
	ResponseIDs     json.RawMessage  `json:"response_ids"`
	Logprobs        json.RawMessage  `json:"logprobs"`
	ChatCompletions json.RawMessage  `json:"chat_completions"`
	Reward          *float64         `json:"reward"`
	Done            *bool            `json:"done"`
	WeightVersion   *int64           `json:"weight_version"`
	ModelOutput     *modelOutputJSON `json:"model_output"`
}

// defaultTrajName is rLLM's name for an unnamed trajectory: not a role.
const defaultTrajName = "default_traj_name"

// EpisodeFiles lists the episode files of path: path itself when it is a
// file, else the *.json files of path/episodes (an `rllm eval` run
// directory) or, when there is no such folder, of path, sorted by name.
func EpisodeFiles(path string) ([]string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return []string{path}, nil
	}
	dir := filepath.Join(path, "episodes")
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		dir = path
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range entries {
		if e.Type().IsRegular() && strings.HasSuffix(e.Name(), ".json") && e.Name() != "meta.json" && e.Name() != "results.json" {
			files = append(files, filepath.Join(dir, e.Name()))
		}
	}
	sort.Strings(files)
	return files, nil
}

// ImportEpisodes reads the episode files of path (see EpisodeFiles) and
// writes, for each trajectory of each episode, its Step records and its
// Trajectory record.
//
// Ids follow rLLM: the task id is the episode id up to its last ':'
// ({task_id}:{rollout_idx}), else the task's "id", else the episode id;
// the trajectory id is the trajectory's uid (else {episode_id}/{index});
// a step's id is its "id" (else {trajectory_id}#{index}); a named
// trajectory (not rLLM's default name) is the role, so the group is
// {task_id}:{name} as in rLLM's trainer. Token fields come from the step,
// or from its model_output when the step's are empty. The episode's
// is_correct and termination_reason go on each of its trajectories; a
// trajectory without a reward takes one from opts.Rewards (by trajectory
// uid, then episode id), else it is a dead letter.
func ImportEpisodes(ctx context.Context, path string, opts Options, out Output) (Summary, error) {
	var sum Summary
	files, err := EpisodeFiles(path)
	if err != nil {
		return sum, fmt.Errorf("episodes %s: %w", path, err)
	}
	em := emitter{out: out, sum: &sum}
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return sum, err
		}
		sum.Sources++
		data, err := os.ReadFile(f)
		if err != nil {
			return sum, fmt.Errorf("episodes: %w", err)
		}
		if err := importEpisode(&em, f, data, opts); err != nil {
			return sum, err
		}
	}
	sum.UnusedRewards = opts.Rewards.unused()
	return sum, nil
}

func importEpisode(em *emitter, file string, data []byte, opts Options) error {
	src := schemas.Source{File: file}
	var ep episodeJSON
	if err := json.Unmarshal(data, &ep); err != nil {
		return em.dead(schemas.ReasonMalformedJSON, src, data, "episode file is not an Episode JSON object: %v", err)
	}
	if ep.ID == "" {
		ep.ID = strings.TrimSuffix(filepath.Base(file), ".json")
	}
	task := episodeTask(ep)
	term := idString(ep.TerminationReason)
	meta := map[string]any{"source": "rllm-episode", "episode_id": ep.ID}
	if ep.EvalIdx != nil {
		meta["eval_idx"] = *ep.EvalIdx
	}
	for ti, raw := range ep.Trajectories {
		var tj trajectoryJSON
		if err := json.Unmarshal(raw, &tj); err != nil {
			if err := em.dead(schemas.ReasonWrongType, src, raw, "episode %q trajectory %d: %v", ep.ID, ti, err); err != nil {
				return err
			}
			continue
		}
		trajID := tj.UID
		if trajID == "" {
			trajID = fmt.Sprintf("%s/%d", ep.ID, ti)
		}
		role := tj.Name
		if role == defaultTrajName {
			role = ""
		}
		key := task
		for si, sraw := range tj.Steps {
			if err := episodeStep(em, src, sraw, task, role, trajID, si, opts); err != nil {
				return err
			}
		}
		tr := &wireTrajectory{Type: "trajectory", TrajectoryID: trajID, TaskID: task, Role: role, NumSteps: int64(len(tj.Steps)),
			TerminationReason: term, IsCorrect: ep.IsCorrect, GroupSize: opts.GroupSize}
		if len(tj.Signals) > 0 {
			tr.Signals = tj.Signals
		}
		m := map[string]any{}
		for k, v := range meta {
			m[k] = v
		}
		if tj.Name != "" {
			m["trajectory_name"] = tj.Name
		}
		tr.Reward = finite(tj.Reward)
		if tj.Reward == nil {
			if o, ok := opts.Rewards.lookup(trajID, ep.ID); ok {
				setOutcome(tr, o)
				if !isNull(o.Metadata) {
					m["metadata"] = o.Metadata
				}
			}
		}
		tr.Metadata = metadataJSON(m)
		if tr.Reward == nil && tj.Reward == nil {
			em.sum.Unscored++
			line, _ := json.Marshal(tr)
			if err := em.dead(schemas.ReasonMissingField, src, line, "episode %q trajectory %q: no reward (null in the episode and not in --rewards)", ep.ID, trajID); err != nil {
				return err
			}
			continue
		}
		if tr.Reward == nil {
			line, _ := json.Marshal(tr)
			if err := em.dead(schemas.ReasonNonFinite, src, line, "episode %q trajectory %q: reward is not finite", ep.ID, trajID); err != nil {
				return err
			}
			continue
		}
		if _, err := em.emit(src, key, tr); err != nil {
			return err
		}
	}
	return nil
}

// episodeTask returns the task id of an episode (see ImportEpisodes).
func episodeTask(ep episodeJSON) string {
	if i := strings.LastIndexByte(ep.ID, ':'); i > 0 {
		return ep.ID[:i]
	}
	var task struct {
		ID json.RawMessage `json:"id"`
	}
	if json.Unmarshal(ep.Task, &task) == nil {
		if id := idString(task.ID); id != "" {
			return id
		}
	}
	return ep.ID
}

func episodeStep(em *emitter, src schemas.Source, raw json.RawMessage, task, role, trajID string, index int, opts Options) error {
	var st stepJSON
	if err := json.Unmarshal(raw, &st); err != nil {
		return em.dead(schemas.ReasonWrongType, src, raw, "trajectory %q step %d: %v", trajID, index, err)
	}
	id := idString(st.ID)
	if id == "" {
		id = fmt.Sprintf("%s#%d", trajID, index)
	}
	s := &wireStep{
		Type: "step", StepID: id, TaskID: task, Role: role, TrajectoryID: trajID, StepIndex: int64(index),
		PromptIDs: rawList(st.PromptIDs), ResponseIDs: rawList(st.ResponseIDs), ResponseLogprobs: rawList(st.Logprobs),
		Reward: finite(st.Reward), Done: st.Done, PolicyVersion: st.WeightVersion,
	}
	if mo := st.ModelOutput; mo != nil {
		// rLLM backfills empty token fields from model_output.
		if emptyList(s.PromptIDs) && !emptyList(mo.PromptIDs) {
			s.PromptIDs = rawList(mo.PromptIDs)
		}
		if emptyList(s.ResponseIDs) && !emptyList(mo.CompletionIDs) {
			s.ResponseIDs = rawList(mo.CompletionIDs)
		}
		if emptyList(s.ResponseLogprobs) && !emptyList(mo.Logprobs) {
			s.ResponseLogprobs = rawList(mo.Logprobs)
		}
		if s.PolicyVersion == nil {
			s.PolicyVersion = mo.WeightVersion
		}
		s.FinishReason = mo.FinishReason
	}
	if s.PolicyVersion == nil && opts.HasPolicyVersion {
		v := opts.PolicyVersion
		s.PolicyVersion = &v
	}
	if st.Reward != nil && s.Reward == nil {
		line, _ := json.Marshal(s)
		return em.dead(schemas.ReasonNonFinite, src, line, "%s: reward is not finite", describe(s))
	}
	if emptyList(s.PromptIDs) && emptyList(s.ResponseIDs) {
		// rllm eval without a token-returning backend saves no ids: such
		// a step cannot train anything.
		s.PromptIDs, s.ResponseIDs, s.ResponseLogprobs = nil, nil, nil
	} else {
		s.ResponseLogprobs = logprobsFor(s.ResponseIDs, s.ResponseLogprobs)
	}
	if !isNull(st.ChatCompletions) {
		s.Messages = st.ChatCompletions
	}
	_, err := em.emit(src, task, s)
	return err
}
