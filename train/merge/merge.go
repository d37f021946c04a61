// Package merge turns step rows into trainer rows the way rLLM's verl
// backend (rllm/trainer/verl/transform.py) and Tinker's datums do: the
// steps of a multi-turn trajectory that extend each other become one row.
//
// The rule, walking a trajectory's steps in order: a step extends the
// current row when its prompt begins with the row's running sequence
// (the row's prompt, then everything appended so far, which is the
// previous step's prompt followed by its response). Then the new prompt
// tokens (the observation: tool output, user turn) are appended to the
// row's response with mask 0, rollout logprob 0 and advantage 0, and the
// step's response tokens with mask 1, their logprobs and advantages (the
// step's token_advantages from distillation when it carries them, else
// its scalar advantage on every token). A step that does not extend the
// sequence (a context reset, a summarised history) closes the row and
// starts the next one with its own prompt.
//
// Rows computes the merged rows of a record of step rows (Schema); Tokens
// counts the tokens they would hold without building them, so token
// budgets can count merged rows. RowsOf and TokensOf do the same over a
// batch's parts without joining them, skipping the rows a filter marked.
// Prompts may be whole or stored as prefix deltas (schemas/prefix):
// merging works on the deltas as stored and rebuilds only the prompts
// that start a merged row.
package merge

import (
	"github.com/apache/arrow-go/v18/arrow"
)

// Column indices of Schema, in order.
const (
	ColGroupID = iota
	ColTaskID
	ColRole
	ColTrajectoryID
	ColFirstStepID
	ColLastStepID
	ColFirstStepIndex
	ColLastStepIndex
	ColStepsMerged
	ColSegment
	ColRowsInTrajectory
	ColNumSteps
	ColIsLast
	ColPolicyVersion
	ColMaxPolicyVersion
	ColGroupVersion
	ColPromptIDs
	ColResponseIDs
	ColResponseMask
	ColRolloutLogProbs
	ColAdvantages
	ColReward
	ColAdvantage
	ColTokenAdvantageSteps
	ColActionTokens
	ColObservationTokens
	ColActionFraction
	ColGroupSize
	ColPartial
	ColIsCorrect
	ColTerminationReason
	ColEstimator
	ColResponseVersions
	NumColumns
)

// LayoutKey is the schema metadata key naming the layout ("trajectories").
const LayoutKey = "rllm_pipe.layout"

// Schema is the Arrow schema of merged rows: one row per run of a
// trajectory's steps that extend each other (one row per trajectory
// unless its context was reset). The list columns response_ids,
// response_mask, rollout_log_probs and advantages have one item per
// response token (actions and observations).
var Schema = arrow.NewSchema([]arrow.Field{
	ColGroupID:      {Name: "group_id", Type: arrow.BinaryTypes.String},
	ColTaskID:       {Name: "task_id", Type: arrow.BinaryTypes.String},
	ColRole:         {Name: "role", Type: arrow.BinaryTypes.String, Nullable: true},
	ColTrajectoryID: {Name: "trajectory_id", Type: arrow.BinaryTypes.String},
	// The row's first and last steps, and how many steps it merges.
	ColFirstStepID:    {Name: "first_step_id", Type: arrow.BinaryTypes.String},
	ColLastStepID:     {Name: "last_step_id", Type: arrow.BinaryTypes.String},
	ColFirstStepIndex: {Name: "first_step_index", Type: arrow.PrimitiveTypes.Int32},
	ColLastStepIndex:  {Name: "last_step_index", Type: arrow.PrimitiveTypes.Int32},
	ColStepsMerged:    {Name: "steps_merged", Type: arrow.PrimitiveTypes.Int32},
	// The row's place among its trajectory's rows (0-based), and how many
	// rows the trajectory has (1 unless a context reset split it).
	ColSegment:          {Name: "segment", Type: arrow.PrimitiveTypes.Int32},
	ColRowsInTrajectory: {Name: "rows_in_trajectory", Type: arrow.PrimitiveTypes.Int32},
	ColNumSteps:         {Name: "num_steps", Type: arrow.PrimitiveTypes.Int32},
	// is_last: the row ends with the trajectory's last step.
	ColIsLast: {Name: "is_last", Type: arrow.FixedWidthTypes.Boolean},
	// The smallest and largest policy version of the row's tokens (the
	// steps' versions and their token_versions).
	ColPolicyVersion:    {Name: "policy_version", Type: arrow.PrimitiveTypes.Int64},
	ColMaxPolicyVersion: {Name: "max_policy_version", Type: arrow.PrimitiveTypes.Int64},
	ColGroupVersion:     {Name: "group_version", Type: arrow.PrimitiveTypes.Int64},
	ColPromptIDs:        {Name: "prompt_ids", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Int32)},
	ColResponseIDs:      {Name: "response_ids", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Int32)},
	// 1 on action (model) tokens, 0 on observation tokens.
	ColResponseMask:    {Name: "response_mask", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Int8)},
	ColRolloutLogProbs: {Name: "rollout_log_probs", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Float32)},
	// Per response token: the step's token advantage (distillation) or its
	// scalar advantage on action tokens, 0 on observation tokens.
	ColAdvantages: {Name: "advantages", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Float32)},
	ColReward:     {Name: "reward", Type: arrow.PrimitiveTypes.Float64},
	// The scalar advantage of the row's first step (the trajectory's, for
	// trajectory-level estimators).
	ColAdvantage: {Name: "advantage", Type: arrow.PrimitiveTypes.Float64},
	// How many of the row's steps carried per-token advantages.
	ColTokenAdvantageSteps: {Name: "token_advantage_steps", Type: arrow.PrimitiveTypes.Int32},
	ColActionTokens:        {Name: "action_tokens", Type: arrow.PrimitiveTypes.Int32},
	ColObservationTokens:   {Name: "observation_tokens", Type: arrow.PrimitiveTypes.Int32},
	// action_tokens / (action_tokens + observation_tokens); 1 when both are 0.
	ColActionFraction:    {Name: "action_fraction", Type: arrow.PrimitiveTypes.Float64},
	ColGroupSize:         {Name: "group_size", Type: arrow.PrimitiveTypes.Int32},
	ColPartial:           {Name: "partial", Type: arrow.FixedWidthTypes.Boolean},
	ColIsCorrect:         {Name: "is_correct", Type: arrow.FixedWidthTypes.Boolean, Nullable: true},
	ColTerminationReason: {Name: "termination_reason", Type: arrow.BinaryTypes.String, Nullable: true},
	ColEstimator:         {Name: "estimator", Type: arrow.BinaryTypes.String},
	// Per response token: the policy version that generated it (the step's
	// token_versions, else its policy_version) on action tokens, -1 on
	// observation tokens.
	ColResponseVersions: {Name: "response_versions", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Int64)},
}, func() *arrow.Metadata {
	m := arrow.NewMetadata([]string{LayoutKey}, []string{"trajectories"})
	return &m
}())

// Stats are the tallies of merging: steps in, rows out, and the response
// tokens by kind.
type Stats struct {
	Steps             int64 `json:"steps"`
	Rows              int64 `json:"rows"`
	Trajectories      int64 `json:"trajectories"`
	ActionTokens      int64 `json:"action_tokens"`
	ObservationTokens int64 `json:"observation_tokens"`
	PromptTokens      int64 `json:"prompt_tokens"`
	// MaxRowsPerTrajectory is the most rows one trajectory became.
	MaxRowsPerTrajectory int32 `json:"max_rows_per_trajectory"`
}

// Add adds o's tallies to s.
func (s *Stats) Add(o Stats) {
	s.Steps += o.Steps
	s.Rows += o.Rows
	s.Trajectories += o.Trajectories
	s.ActionTokens += o.ActionTokens
	s.ObservationTokens += o.ObservationTokens
	s.PromptTokens += o.PromptTokens
	s.MaxRowsPerTrajectory = max(s.MaxRowsPerTrajectory, o.MaxRowsPerTrajectory)
}

// ActionFraction is the share of response tokens that are actions.
func (s Stats) ActionFraction() float64 {
	if n := s.ActionTokens + s.ObservationTokens; n > 0 {
		return float64(s.ActionTokens) / float64(n)
	}
	return 1
}

// Tokens returns the prompt and response tokens of the merged rows of the
// step rows in parts, read in order as one sequence (a group's rows split
// over reader batches): per merged row, its last step's prompt and
// response. Rows may be stored as prefix deltas (see Seq).
func Tokens(parts []arrow.RecordBatch) (int64, error) {
	return TokensOf(parts, false)
}

// TokensOf is Tokens over the rows that skipFiltered keeps: with it, rows
// a filter marked (filter_reason) are left out of the merged rows, as if
// they had been dropped before, while prefix deltas may still extend them.
func TokensOf(parts []arrow.RecordBatch, skipFiltered bool) (int64, error) {
	q, err := newSeq(parts, skipFiltered)
	if err != nil {
		return 0, err
	}
	var (
		n    int64
		prev = -1
	)
	for _, i := range q.kept {
		n += int64(q.plen[i] + q.respLen(i))
		if prev >= 0 && q.continues(i, prev) {
			n -= int64(q.plen[prev] + q.respLen(prev))
		}
		prev = i
	}
	return n, nil
}
