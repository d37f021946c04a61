// Package flight serves a consumer group's batches to trainers over Arrow
// Flight (gRPC), the endpoint the Python client rllm_pipe talks to. It
// sits at the trainer edge: it imports train, train/merge, the store
// interface (connectors/store) and the Flight and gRPC libraries, and
// nothing of ingest, transform or the other connectors.
//
// # Protocol
//
// DoGet with a JSON ticket {"consumer": NAME, "policy_version": V, "key": K}
// joins the server's consumer group as member NAME (optional; a random
// name otherwise) and streams batches as Arrow record batches of the shard
// schema. K is the stream's secret (at least 16 characters, chosen by the
// client; when absent the server makes one and hands it in the first
// batch's metadata). Each batch carries app_metadata, JSON:
//
//	{"batch_id": 7, "consumer": NAME, "member": NAME/RUN, "groups": [...], "tokens": 8123, "rows": 64, "oversized": false, "key": K}
//
// ("key" only when the server made it). A server whose consumers merge
// trajectories (train.LayoutTrajectories) streams rows of merge.Schema
// instead, and adds "layout": "trajectories" and "merge": {steps, rows,
// trajectories, action_tokens, observation_tokens, ...} to the metadata;
// "tokens" then counts the merged rows' tokens. The stream ends when every
// committed shard is done (unless the server follows the manifest), when
// the client cancels it, or when the server drops it (below); either way
// the member's unacknowledged work is released to the group at once.
//
// Actions (DoAction), JSON bodies; "key" is the stream's secret:
//   - "ack" {"consumer", "key", "member"?, "batch_ids": [...], "policy_version"?} → {"groups": n, "lost": m};
//     repeating an ack returns the first answer; naming the member of an
//     ended stream is refused
//   - "set_policy_version" {"consumer", "key", "policy_version"} → {"policy_version": v}
//   - "stats" {"consumer", "key"} → the member's tallies, also after its
//     stream ended; without a key (any member's, or {} for all streaming
//     members) only with the admin token
//
// At most MaxInflight batches per member await acknowledgement; the
// stream waits beyond that, so an acknowledging trainer sets the pace.
// Staleness is judged when a batch is formed: batches already formed
// (up to MaxInflight) keep the policy version they were formed under. A
// trainer that reports its new version with the acknowledgement that
// frees the slot (ack with policy_version) gets the next batch judged by
// it.
//
// # Security model
//
// Authentication: with Options.Token or Options.AdminToken set, every call
// (unary and stream) must carry "authorization: Bearer TOKEN" with one of
// them; tokens are compared in constant time (of their SHA-256) and never
// logged. The admin token is also a member token, and the only one that
// reads other members' stats. Without any token Serve refuses an address
// beyond loopback (ErrNeedToken), so an unauthenticated server is only
// reachable from its own host. With Options.TLS the server speaks TLS
// only; without it a token crosses the network in the clear.
//
// A stream is one member: ack, set_policy_version and a member's own
// stats name the consumer and carry the secret key of its stream, which
// only the client that opened the stream knows (stats never shows it). A
// call whose key does not match the consumer's live stream is refused
// (PermissionDenied), so no client can acknowledge, or move the policy
// version of, another client's stream — not through an empty ack either.
// A key outlives its stream only for stats.
//
// Policy versions from clients (tickets, acks, set_policy_version) must
// lie in [0, train.MaxPolicyVersion]; others are refused (InvalidArgument).
//
// # Limits
//
//   - Options.MaxStreams streams at once (default 64), at most
//     Options.MaxStreamsPerConn (default 4) of one client connection and
//     Options.MaxStreamsPerHost (default 16) of one client host; when the
//     server or a host is full, a new stream evicts one that has
//     acknowledged nothing for Options.SendTimeout, else it is refused
//     (ResourceExhausted) before it joins the group. A consumer name
//     streams once at a time (AlreadyExists).
//   - Options.MemberTokens: a consumer with its own token is outside those
//     limits and never evicted; only its token streams under its name and
//     that token under no other (PermissionDenied). Holders of the shared
//     token, from any host, cannot keep it out.
//   - Options.MaxStreamBytes: a stream whose batches sent and not yet
//     acknowledged reach this many bytes waits for acknowledgements before
//     the next batch (one batch always goes).
//   - Options.SendTimeout: a batch the client does not take within it (its
//     gRPC flow-control window stays full) drops the stream.
//   - Options.AckTimeout: a stream with batches in flight and no
//     acknowledgement for this long is dropped, so a client that stops
//     (reading or acknowledging) gives its shards back to the group.
//   - Shutdown: when Serve's context ends every stream ends; connections
//     still open after Options.ShutdownGrace (a client that does not read
//     its stream's end) are closed. Server.Abort closes everything at once.
package flight
