// Package gateway is the capture gateway core: an OpenAI-compatible reverse
// proxy in front of vLLM/SGLang workers that speaks rLLM's model-gateway API
// (rllm-org/rllm, rllm-model-gateway) and turns every LLM call an agent makes
// inside a session into a Step record of the wire format (schemas/README.md),
// stamped with the weight version in force at dispatch, and every
// POST /sessions/{id}/finish into the Trajectory record that closes it.
//
// Records go to an Output (Kafka, a record log, a shard root: package
// connectors/gatewayout opens one from a --to URL) through a bounded queue:
// the agent's response never waits for the output, but beyond
// Config.MaxBufferedBytes new calls are refused with 503, and finish and
// POST /records answer 200 only once their records are durable (Output.Write
// returned nil). Nothing acknowledged is dropped: a failed Write is retried
// until it succeeds or Close gives up (and says how much was left). A
// record no retry can write never holds the others up: one larger than the
// output takes (Config.MaxRecordBytes) is refused with 413 when it is
// posted or is a finish's trajectory, and written as its stub when it is a
// recorded step (metadata.gateway_reject = too_large; ingest dead-letters
// it as missing_field under its own step id); one the Output refuses all
// the same (RefusedError: a topic's own message.max.bytes) gets its stub
// in its place, counted (rllm_gateway_errors_total{kind="output_refused"}).
//
// Routes (Server.Handler):
//
//	/sessions/{session_id}/v1/...      agent calls in a session (chat and completions recorded)
//	/sessions/{session_id}/generate    SGLang's native /generate in a session (recorded)
//	/v1/...                            calls outside a session: forwarded and counted, not recorded
//	POST/GET /sessions, GET/DELETE /sessions/{id}, GET /sessions/{id}/traces,
//	POST /sessions/{id}/finish, POST /sessions/batch_delete, GET /traces/{id},
//	POST /traces/query, GET/POST /admin/workers, DELETE /admin/workers/{id},
//	GET/POST /admin/weight_version, POST /admin/flush, POST /admin/reload,
//	POST /records, GET /metrics, GET /health, GET /health/workers
//
// Agent routes need Config.AgentToken or Config.AdminToken (as rLLM's
// gateway), the rest Config.AdminToken (sent as "Authorization: Bearer" or
// "x-api-key", compared in constant time; empty means none, which cmd
// allows on loopback only); POST /records takes either (workers that
// build their own records are agents too); /health is open. The agents'
// tokens never go upstream: the workers get Config.UpstreamKey, if any,
// as "Authorization: Bearer". Trace ids are URL-safe (32 hex digits
// of the step id's SHA-256): rLLM's client puts them in URLs unescaped.
//
// A multi-turn agent's call sends the whole conversation so far: a step
// whose prompt begins with the session's previous step's prompt and
// response is written with parent_step_id and prompt_delta_ids, the new
// tokens only (schemas/README.md), unless Config.WholePrompts.
//
// Decisions, each as rLLM's gateway makes them unless said otherwise:
//
//   - Request rewriting: logprobs (true for chat, 0 for completions, which
//     returns the sampled token's logprob only) and return_token_ids are
//     added when absent, and set when the agent turned them off (rLLM leaves
//     an explicit false alone and records a call it cannot train on); a
//     session's sampling_params fill the keys the agent did not send. The
//     response the agent gets has logprobs and token ids set back to null
//     when it did not ask for them, as vLLM would answer it directly.
//   - n > 1: choice 0 is the step (rLLM's data_process.py reads
//     choices[0] only); the other choices reach the agent, are counted
//     (rllm_gateway_choices_unrecorded_total) and the step's metadata says n.
//   - One logprob per response token: a null entry or a count mismatch is
//     not repaired. The call is proxied unchanged and its Step record is
//     written with the logprobs as the upstream gave them, a null in its
//     place (ingest dead-letters it as wrong_type, as it does the same
//     defect from `import rllm` or rllm_pipe.emit), or too few or too many
//     (length_mismatch), and metadata.gateway_reject = null_logprob |
//     logprob_count, the specific reason; a response with no token ids or
//     an unreadable body is written without the missing fields
//     (gateway_reject = missing_token_ids | unreadable_response) and ingest
//     dead-letters it as missing_field. Both are counted here
//     (rllm_gateway_rejected_steps_total{reason}). The session's
//     trajectory record then says rejected_steps = how many: ingest
//     dead-letters it (rejected_step) and closes its group as soon as the
//     other trajectories are in, instead of at the group timeout.
//   - A stream cut short (the agent disconnected, the upstream stream
//     broke, or it ended with an error event, as vLLM ends a generation
//     that failed) is recorded with what arrived, finish_reason "abort" and
//     metadata.cut_off = client_disconnect | upstream_cut | upstream_error
//     (or too_large: a stream longer than Config.MaxResponseBytes is
//     stopped there). The upstream
//     request is cancelled when the agent goes mid-stream (vLLM aborts the
//     generation).
//   - A recorded call's upstream request is not cancelled with the agent's
//     before the answer starts: an agent that leaves a non-streaming call,
//     or a stream before its first byte, still has the whole answer
//     recorded, with its own finish_reason and metadata.cut_off =
//     client_disconnect (the agent never saw it, so the next call does not
//     extend it). The request runs on at most Config.AbandonedCallTimeout
//     after the agent left.
//   - Upstream errors (a status other than 200, no worker reachable) go to
//     the agent with their status and body and are counted; no step, and
//     no session left behind by a call that created it. A session id
//     POST /sessions would refuse is refused on the recorded routes too.
//   - step_index is the order in which a session's calls completed (a
//     failed call takes no index, so indices have no holes); step_id is
//     "{trajectory_id}#{step_index}", so a retried write is a duplicate
//     downstream, not a new step.
//   - trajectory_id is "{session_id}@{run}.{n}" unless POST /sessions names
//     one: run is drawn at random when the gateway starts and n counts its
//     sessions, so a session id used again (after finish, DELETE or a
//     restart) never repeats an earlier incarnation's step or trajectory
//     ids, which ingest would drop as retries or late duplicates (rLLM
//     names trajectories with fresh uuids too). task_id still comes from
//     the session id ({task_id}:{rollout_idx}); the session id rides in
//     the step's and the trajectory's metadata.
//   - A finished session refuses calls (409) until POST /sessions starts
//     its id again, as a new incarnation; so does one deleted after it
//     finished (Config.MaxRetiredSessions ids are remembered). A repeat
//     of its finish with the same body is answered as the first one was,
//     also after it left the table; another body is a 409. A session
//     deleted while open is forgotten: the next call starts a new one.
//   - Step fields the wire format has no column for (latency_ms, tools, the
//     session id, usage, n) ride in the step's metadata object.
//
// The loop (Config.Trainer, Config.Pacing): the gateway polls the
// trainer's side — the newest policy version it published, the groups
// committed and consumed — and stamps calls with that version (never
// lowering it); with Pacing, a new group's first call waits while the pipe
// is full (see Pacing), then gets 429 with Retry-After. A session's
// finish, DELETE or failed first call counts it out of its group; a group
// whose sessions all ended counts as in flight until the manifest lists
// it (or Pacing.CommitTimeout passes).
//
// The package must not import connectors/ or the pipeline runtime:
// outputs are injected (connectors/gatewayout is where they are built).
package gateway
