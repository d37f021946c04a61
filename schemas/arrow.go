package schemas

import "github.com/apache/arrow-go/v18/arrow"

// Column indices of StepSchema, in order.
const (
	ColGroupID = iota
	ColTaskID
	ColRole
	ColTrajectoryID
	ColStepID
	ColStepIndex
	ColNumSteps
	ColPolicyVersion
	ColGroupVersion
	ColPromptIDs
	ColResponseIDs
	ColResponseLogprobs
	ColTokenVersions
	ColTeacherLogprobs
	ColMessages
	ColReward
	ColStepReward
	ColAdvantage
	ColGroupSize
	ColExpectedGroupSize
	ColPartial
	ColFinishReason
	ColTerminationReason
	ColDone
	ColIsCorrect
	ColModel
	ColCreatedAt
	ColMetadata
	ColTrajectoryMetadata
	ColSignals
	ColSourceFile
	ColSourceLine
	ColTokenAdvantages
	ColFilterReason
	ColEstimator
	ColSourceTopic
	ColSourcePartition
	ColSourceOffset
	ColPromptPrefixLen
	ColPromptDeltaIDs
	ColMessagesDelta
	NumColumns
)

// SchemaVersion is stored in every shard's key-value metadata and bumped
// whenever a column is added, renamed or retyped.
const SchemaVersion = "4"

// StepSchema is the Arrow schema of committed shards: one row per step,
// carrying its trajectory's and group's values. Token lists are LIST (not
// LARGE_LIST) and timestamps microseconds UTC, which every Parquet reader
// handles. messages and metadata hold JSON text exactly as received
// (invalid UTF-8 repaired).
var StepSchema = arrow.NewSchema([]arrow.Field{
	ColGroupID:       {Name: "group_id", Type: arrow.BinaryTypes.String},
	ColTaskID:        {Name: "task_id", Type: arrow.BinaryTypes.String},
	ColRole:          {Name: "role", Type: arrow.BinaryTypes.String, Nullable: true},
	ColTrajectoryID:  {Name: "trajectory_id", Type: arrow.BinaryTypes.String},
	ColStepID:        {Name: "step_id", Type: arrow.BinaryTypes.String},
	ColStepIndex:     {Name: "step_index", Type: arrow.PrimitiveTypes.Int32},
	ColNumSteps:      {Name: "num_steps", Type: arrow.PrimitiveTypes.Int32},
	ColPolicyVersion: {Name: "policy_version", Type: arrow.PrimitiveTypes.Int64},
	ColGroupVersion:  {Name: "group_version", Type: arrow.PrimitiveTypes.Int64},
	// prompt_ids is the step's whole prompt, or null when the prompt is
	// stored as a delta (prompt_prefix_len > 0): see ColPromptPrefixLen.
	ColPromptIDs:          {Name: "prompt_ids", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Int32), Nullable: true},
	ColResponseIDs:        {Name: "response_ids", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Int32)},
	ColResponseLogprobs:   {Name: "response_logprobs", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Float32)},
	ColTokenVersions:      {Name: "token_versions", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Int64), Nullable: true},
	ColTeacherLogprobs:    {Name: "teacher_logprobs", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Float32), Nullable: true},
	ColMessages:           {Name: "messages", Type: arrow.BinaryTypes.String, Nullable: true},
	ColReward:             {Name: "reward", Type: arrow.PrimitiveTypes.Float64},
	ColStepReward:         {Name: "step_reward", Type: arrow.PrimitiveTypes.Float64, Nullable: true},
	ColAdvantage:          {Name: "advantage", Type: arrow.PrimitiveTypes.Float64},
	ColGroupSize:          {Name: "group_size", Type: arrow.PrimitiveTypes.Int32},
	ColExpectedGroupSize:  {Name: "expected_group_size", Type: arrow.PrimitiveTypes.Int32},
	ColPartial:            {Name: "partial", Type: arrow.FixedWidthTypes.Boolean},
	ColFinishReason:       {Name: "finish_reason", Type: arrow.BinaryTypes.String, Nullable: true},
	ColTerminationReason:  {Name: "termination_reason", Type: arrow.BinaryTypes.String, Nullable: true},
	ColDone:               {Name: "done", Type: arrow.FixedWidthTypes.Boolean, Nullable: true},
	ColIsCorrect:          {Name: "is_correct", Type: arrow.FixedWidthTypes.Boolean, Nullable: true},
	ColModel:              {Name: "model", Type: arrow.BinaryTypes.String, Nullable: true},
	ColCreatedAt:          {Name: "created_at", Type: &arrow.TimestampType{Unit: arrow.Microsecond, TimeZone: "UTC"}, Nullable: true},
	ColMetadata:           {Name: "metadata", Type: arrow.BinaryTypes.String, Nullable: true},
	ColTrajectoryMetadata: {Name: "trajectory_metadata", Type: arrow.BinaryTypes.String, Nullable: true},
	ColSignals:            {Name: "signals", Type: arrow.MapOf(arrow.BinaryTypes.String, arrow.PrimitiveTypes.Float64), Nullable: true},
	// Lineage: file and line for file inputs, topic, partition and offset
	// for Kafka; the others are null.
	ColSourceFile: {Name: "source_file", Type: arrow.BinaryTypes.String, Nullable: true},
	ColSourceLine: {Name: "source_line", Type: arrow.PrimitiveTypes.Int64, Nullable: true},
	// Per-token advantages (on-policy distillation); null unless asked for
	// and the step carries teacher logprobs.
	ColTokenAdvantages: {Name: "token_advantages", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Float32), Nullable: true},
	// Why a filter marked the row (trainers skip it by default); null when
	// kept. Several reasons are joined with ",".
	ColFilterReason: {Name: "filter_reason", Type: arrow.BinaryTypes.String, Nullable: true},
	// The estimator and conventions that produced advantage, e.g. "grpo/rllm".
	ColEstimator:       {Name: "estimator", Type: arrow.BinaryTypes.String},
	ColSourceTopic:     {Name: "source_topic", Type: arrow.BinaryTypes.String, Nullable: true},
	ColSourcePartition: {Name: "source_partition", Type: arrow.PrimitiveTypes.Int32, Nullable: true},
	ColSourceOffset:    {Name: "source_offset", Type: arrow.PrimitiveTypes.Int64, Nullable: true},
	// Prefix-delta storage of multi-turn prompts (schema 4). A step whose
	// prompt begins with its predecessor's prompt and response (same
	// trajectory, step_index one less, the row just before it in the
	// shard) stores prompt_prefix_len = that length, prompt_ids null and
	// prompt_delta_ids the tokens after it; any other step stores
	// prompt_prefix_len 0, its whole prompt_ids and an empty
	// prompt_delta_ids. So the whole prompt is
	//   predecessor's prompt ++ predecessor's response ++ prompt_delta_ids.
	// messages likewise: when the step's messages begin with its
	// predecessor's (the JSON text up to its closing bracket), messages is
	// null and messages_delta holds the text after that point, so the
	// whole messages are predecessor's messages minus its last byte ++
	// messages_delta. A chain never crosses shards.
	ColPromptPrefixLen: {Name: "prompt_prefix_len", Type: arrow.PrimitiveTypes.Int32},
	ColPromptDeltaIDs:  {Name: "prompt_delta_ids", Type: arrow.ListOfNonNullable(arrow.PrimitiveTypes.Int32)},
	ColMessagesDelta:   {Name: "messages_delta", Type: arrow.BinaryTypes.String, Nullable: true},
}, nil)

// PartitionKey is the Hive-style folder key of a shard: policy=<N>, where N
// is the group's policy version (the minimum over its steps). It is not a
// column name, so readers that detect Hive partitions never shadow a
// column with it.
const PartitionKey = "policy"
