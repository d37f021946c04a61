// Package synth writes realistic synthetic RL agent traces in the
// project's wire format (JSON lines) for demos, tests and benchmarks.
//
// Generate streams step records (one per LLM call) and trajectory records
// (one per scored run) for a configurable number of task groups. The output
// looks like what a rollout fleet produces: groups of rollouts per task with
// task-dependent difficulty, multi-turn tool-calling conversations whose
// prompts grow with each turn, records of several groups interleaved,
// records displaced out of order, policy versions that advance over the run
// with a few stale dispatches, optional producer-retry duplicates and
// optional multi-agent roles. Token ids are random (nothing for a
// compressor to find) or, with TokensText, drawn like a tokenizer's output
// of text (tokens.go).
//
// The generator is deterministic for a given Config (including Seed), keeps
// memory bounded by the in-flight window rather than the dataset size, and
// builds lines by hand into a reused buffer so that it can produce
// benchmark inputs of a gigabyte or more quickly.
package synth
