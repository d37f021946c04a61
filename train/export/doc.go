// Package export turns committed shards into datasets for other kinds of
// training: supervised fine-tuning rows in TRL's formats (the best
// rollouts, rejection-sampling fine-tuning) and on-policy distillation
// data (student tokens and logprobs, teacher logprobs, per-token
// advantages), with scoring requests for steps a teacher has not scored
// yet. Exports read only the columns they need, and CheckOutput refuses
// an output that would write into the store they read.
package export
