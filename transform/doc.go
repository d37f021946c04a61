// Package transform assembles complete groups from a stream of decoded
// records and turns them into Arrow record batches with advantages.
//
// The Assembler is a single-goroutine state machine: it takes records in
// any order (trajectory records before their steps, steps out of order,
// groups interleaved, producer retries) and emits a group the moment it
// holds its group size of complete trajectories. Stragglers are handled by
// a timeout and, at the end of a finite input, by emitting groups that have
// at least the minimum size as partial; everything else goes to the
// dead-letter output with a reason. The Batcher lays emitted groups out in
// Arrow columns (one row per step) and calls an advantage.Estimator over
// them. Stage wires both between bounded channels.
//
// transform imports schemas, ingest (for its Item type) and advantage; it
// never imports a connector.
package transform
