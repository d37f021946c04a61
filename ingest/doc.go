// Package ingest is the first stage of the pipeline: sources of raw
// records (files and stdin here; Kafka lives in connectors/kafka) and the
// decoder that turns each JSON line into a typed schemas.Step or
// schemas.Trajectory, or into a *schemas.RejectError with a stable reason.
//
// Data flows source → decode (this package) → group (transform) →
// advantage → encode and sink (connectors). This package imports only
// schemas, golang.org/x/sync and the standard library; it never touches
// Arrow or Parquet.
//
// The decoder is hand-written: it parses straight into typed slices with no
// reflection and no intermediate maps, accepts Python's NaN and Infinity
// tokens so that they are reported as non_finite rather than malformed, and
// repairs invalid UTF-8 (counted, record kept).
//
// Files are memory-mapped and their lines handed to the decoders in place
// (mapped.go); a decoded record keeps where its line lies (RawRef) rather
// than a copy, and only a dead letter reads it again.
package ingest
