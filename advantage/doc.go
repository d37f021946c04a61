// Package advantage computes advantage estimates over Arrow columns. Its
// functions are pure kernels: no I/O, no goroutines, no knowledge of where
// the columns came from. The same kernels serve the ingest path (one call
// per batch of complete groups) and the trainer's batch path
// (BatchEstimator, train's batch-level estimators).
//
// Groups are described by offsets into trajectory-level columns: group g
// holds trajectories offsets[g] .. offsets[g+1]-1. Estimators produce one
// advantage per trajectory; callers broadcast it to the trajectory's steps
// (rLLM's "broadcast" mode).
package advantage
