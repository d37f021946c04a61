// Package rllmdata reads what rLLM users already have on disk and turns it
// into wire-format records (schemas/README.md): the model gateway's SQLite
// trace store (one Step per captured call, one Trajectory per session
// when a reward is known) and the Episode JSON files of an `rllm eval` run
// (Step and Trajectory records per trajectory of each episode).
//
// It sits beside the decoder in the ingest stage, before the pipeline:
// its output is JSON lines that `rllm-pipe ingest --from` reads. Every
// line it writes has been checked with ingest.Decoder, so a record the
// pipeline would reject is never written; it becomes a dead letter
// (schemas.DeadLetter, with the stable reason the decoder gave and the
// would-be line as its record) instead. Nothing is shortened or guessed:
// a null logprob entry, a logprob list shorter than the response, a
// missing policy version or reward are dead letters, counted by reason.
//
// Imports run in the calling goroutine and hold one session (SQLite) or
// one episode file in memory at a time. This package imports ingest,
// schemas, the standard library and the SQLite driver; nothing of the
// transform or connector stages.
package rllmdata
