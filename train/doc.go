// Package train will hold the trainer-side consumers of committed shards:
// asynchronous consumption with staleness bounds, consumer groups with
// leases, and token-budget batching (issue 5). It reads shards only through
// the manifest written by connectors/local (and later connectors/s3), and
// computes batch-level advantages with the kernels of package advantage.
//
// Nothing is implemented here yet; the folder exists so that the layout of
// the repository shows where trainer code goes.
package train
