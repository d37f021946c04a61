// Package train is the trainer side: it reads committed shards (only those
// a manifest lists), skips groups staler than the trainer allows and rows
// a filter marked, and forms micro-batches by token budget without ever
// splitting a group, applying a batch-level advantage estimator when asked.
//
// Consumer groups with leases, checkpoints in the store, an Arrow Flight
// endpoint and the Python client build on this (issue 5, in progress).
package train
