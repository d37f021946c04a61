// Package flight serves a consumer group's batches to trainers over Arrow
// Flight (gRPC), the endpoint the Python client rllm_pipe talks to.
//
// # Protocol
//
// DoGet with a JSON ticket {"consumer": NAME, "policy_version": V} joins
// the server's consumer group as member NAME (optional; a random name
// otherwise) and streams batches as Arrow record batches of the shard
// schema. Each carries app_metadata, JSON:
//
//	{"batch_id": 7, "consumer": NAME, "member": NAME/RUN, "groups": [...], "tokens": 8123, "rows": 64, "oversized": false}
//
// The stream ends when every committed shard is done (unless the server
// follows the manifest) or when the client cancels it; either way the
// member's unacknowledged work is released to the group at once.
//
// Actions (DoAction), JSON bodies:
//   - "ack" {"consumer", "member"?, "batch_ids": [...], "policy_version"?} → {"groups": n, "lost": m};
//     repeating an ack returns the first answer; naming the member of an
//     ended stream is refused
//   - "set_policy_version" {"consumer", "policy_version"} → {"policy_version": v}
//   - "stats" {"consumer"} → the member's tallies, also after its stream
//     ended (all streaming members without a name)
//
// At most MaxInflight batches per member await acknowledgement; the
// stream waits beyond that, so an acknowledging trainer sets the pace.
// Staleness is judged when a batch is formed: batches already formed
// (up to MaxInflight) keep the policy version they were formed under. A
// trainer that reports its new version with the acknowledgement that
// frees the slot (ack with policy_version) gets the next batch judged by
// it.
package flight

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/apache/arrow-go/v18/arrow/flight"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rllm-pipe/rllm-pipe/train"
)

// Group opens members of the served consumer group.
type Group interface {
	Join(ctx context.Context, name string, policyVersion *int64) (*train.Consumer, error)
}

// Ticket is a DoGet request.
type Ticket struct {
	Consumer      string `json:"consumer,omitempty"`
	PolicyVersion *int64 `json:"policy_version,omitempty"`
}

// BatchMeta is the app_metadata of every streamed batch.
type BatchMeta struct {
	BatchID  uint64 `json:"batch_id"`
	Consumer string `json:"consumer"`
	// Member is this stream's run of the consumer (name/incarnation);
	// an ack that names it is refused by any later stream of the name.
	Member    string   `json:"member"`
	Groups    []string `json:"groups"`
	Tokens    int64    `json:"tokens"`
	Rows      int64    `json:"rows"`
	Oversized bool     `json:"oversized"`
}

type ackRequest struct {
	Consumer string   `json:"consumer"`
	Member   string   `json:"member,omitempty"` // the stream the batches came from
	BatchIDs []uint64 `json:"batch_ids"`
	// PolicyVersion, if set, is applied before the acknowledgement: the
	// batch formed next (after the acknowledgement frees a slot) is judged
	// against it.
	PolicyVersion *int64 `json:"policy_version,omitempty"`
}

type policyRequest struct {
	Consumer      string `json:"consumer"`
	PolicyVersion int64  `json:"policy_version"`
}

// Server is the Flight service.
type Server struct {
	flight.BaseFlightServer
	group Group

	// closing ends every stream at shutdown (a graceful stop would wait
	// for streams that follow the manifest forever).
	closing context.Context
	close   context.CancelFunc

	mu      sync.Mutex
	members map[string]*train.Consumer
	left    map[string]train.Stats // final tallies of members whose stream ended
}

// NewServer serves members of group.
func NewServer(group Group) *Server {
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{group: group, members: map[string]*train.Consumer{}, left: map[string]train.Stats{}, closing: ctx, close: cancel}
}

func (s *Server) member(name string) (*train.Consumer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.members[name]
	if c == nil { // absent, or still joining (its name is reserved)
		return nil, status.Errorf(codes.NotFound, "no consumer %q is streaming from this server", name)
	}
	return c, nil
}

// DoGet streams batches to one member; see the package comment.
func (s *Server) DoGet(tkt *flight.Ticket, stream flight.FlightService_DoGetServer) error {
	var t Ticket
	if len(tkt.GetTicket()) > 0 {
		if err := json.Unmarshal(tkt.GetTicket(), &t); err != nil {
			return status.Errorf(codes.InvalidArgument, "ticket: %v", err)
		}
	}
	if t.Consumer == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		t.Consumer = "flight-" + hex.EncodeToString(b[:])
	}
	if err := train.CheckName("consumer", t.Consumer); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	stop := context.AfterFunc(s.closing, cancel)
	defer stop()
	s.mu.Lock()
	if _, busy := s.members[t.Consumer]; busy {
		s.mu.Unlock()
		return status.Errorf(codes.AlreadyExists, "consumer %q is already streaming", t.Consumer)
	}
	s.members[t.Consumer] = nil // reserve the name
	s.mu.Unlock()
	c, err := s.group.Join(ctx, t.Consumer, t.PolicyVersion)
	if err != nil {
		s.mu.Lock()
		delete(s.members, t.Consumer)
		s.mu.Unlock()
		return status.Errorf(codes.Unavailable, "join: %v", err)
	}
	s.mu.Lock()
	s.members[t.Consumer] = c
	s.mu.Unlock()
	member := c.Stats().Member
	slog.Info("flight: consumer joined", "consumer", t.Consumer, "member", member)
	defer func() {
		s.mu.Lock()
		delete(s.members, t.Consumer)
		s.mu.Unlock()
		// Release the member's shards even though the stream's context is
		// gone: its unacknowledged batches go to the others at once.
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Close(cctx); err != nil {
			slog.Warn("flight: releasing a consumer's shards", "consumer", t.Consumer, "err", err)
		}
		st := c.Stats()
		s.mu.Lock()
		if len(s.left) >= 4096 { // bounded: forget one at random
			for k := range s.left {
				delete(s.left, k)
				break
			}
		}
		s.left[t.Consumer] = st
		s.mu.Unlock()
		slog.Info("flight: consumer left", "consumer", t.Consumer, "batches", st.Batches, "groups_acked", st.GroupsAcked)
	}()

	var w *flight.Writer
	defer func() {
		if w != nil {
			w.Close()
		}
	}()
	for {
		d, err := c.Next(ctx)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return status.FromContextError(ctx.Err()).Err()
			}
			return status.Errorf(codes.Internal, "next batch: %v", err)
		}
		meta, _ := json.Marshal(BatchMeta{BatchID: d.ID, Consumer: t.Consumer, Member: member, Groups: d.Groups, Tokens: d.Tokens, Rows: d.Record.NumRows(), Oversized: d.Oversized})
		if w == nil {
			w = flight.NewRecordWriter(stream, ipc.WithSchema(d.Record.Schema()))
		}
		err = w.WriteWithAppMetadata(d.Record, meta)
		d.Record.Release()
		if err != nil {
			return err
		}
	}
}

// DoAction handles ack, set_policy_version and stats.
func (s *Server) DoAction(a *flight.Action, stream flight.FlightService_DoActionServer) error {
	reply := func(v any) error {
		body, err := json.Marshal(v)
		if err != nil {
			return status.Errorf(codes.Internal, "encode reply: %v", err)
		}
		return stream.Send(&flight.Result{Body: body})
	}
	switch a.GetType() {
	case "ack":
		var r ackRequest
		if err := json.Unmarshal(a.GetBody(), &r); err != nil {
			return status.Errorf(codes.InvalidArgument, "ack: %v", err)
		}
		c, err := s.member(r.Consumer)
		if err != nil {
			return err
		}
		if r.Member != "" && r.Member != c.Stats().Member {
			return status.Errorf(codes.FailedPrecondition, "batches of %s: that stream of %q has ended (its unacknowledged batches went back to the group)", r.Member, r.Consumer)
		}
		if r.PolicyVersion != nil {
			c.SetPolicyVersion(*r.PolicyVersion)
		}
		var total train.AckResult
		for _, id := range r.BatchIDs {
			res, err := c.Ack(stream.Context(), id)
			total.Groups += res.Groups
			total.Lost += res.Lost
			if err != nil && !errors.Is(err, train.ErrLeaseLost) {
				return status.Errorf(codes.FailedPrecondition, "ack %d: %v", id, err)
			}
		}
		return reply(total)
	case "set_policy_version":
		var r policyRequest
		if err := json.Unmarshal(a.GetBody(), &r); err != nil {
			return status.Errorf(codes.InvalidArgument, "set_policy_version: %v", err)
		}
		c, err := s.member(r.Consumer)
		if err != nil {
			return err
		}
		c.SetPolicyVersion(r.PolicyVersion)
		return reply(map[string]int64{"policy_version": r.PolicyVersion})
	case "stats":
		var r struct {
			Consumer string `json:"consumer"`
		}
		if len(a.GetBody()) > 0 {
			if err := json.Unmarshal(a.GetBody(), &r); err != nil {
				return status.Errorf(codes.InvalidArgument, "stats: %v", err)
			}
		}
		if r.Consumer != "" {
			c, err := s.member(r.Consumer)
			if err != nil {
				s.mu.Lock()
				st, ok := s.left[r.Consumer]
				s.mu.Unlock()
				if ok {
					return reply(st)
				}
				return err
			}
			return reply(c.Stats())
		}
		s.mu.Lock()
		all := map[string]train.Stats{}
		for name, c := range s.members {
			if c != nil {
				all[name] = c.Stats()
			}
		}
		s.mu.Unlock()
		return reply(all)
	default:
		return status.Errorf(codes.Unimplemented, "unknown action %q (have ack, set_policy_version, stats)", a.GetType())
	}
}

// ListActions names the actions.
func (s *Server) ListActions(_ *flight.Empty, stream flight.FlightService_ListActionsServer) error {
	acts := []*flight.ActionType{
		{Type: "ack", Description: `{"consumer", "batch_ids": [...]}: acknowledge delivered batches`},
		{Type: "set_policy_version", Description: `{"consumer", "policy_version"}: the trainer's policy version, for staleness`},
		{Type: "stats", Description: `{"consumer"} (optional): a member's tallies, or every member's`},
	}
	sort.Slice(acts, func(i, j int) bool { return acts[i].Type < acts[j].Type })
	for _, a := range acts {
		if err := stream.Send(a); err != nil {
			return err
		}
	}
	return nil
}

// Serve runs a Flight server for srv on addr until ctx ends; ready, if
// set, receives the bound address.
func Serve(ctx context.Context, addr string, srv *Server, ready func(string)) error {
	fs := flight.NewServerWithMiddleware(nil)
	if err := fs.Init(addr); err != nil {
		return fmt.Errorf("flight: listen on %s: %w", addr, err)
	}
	fs.RegisterFlightService(srv)
	if ready != nil {
		ready(fs.Addr().String())
	}
	errc := make(chan error, 1)
	go func() { errc <- fs.Serve() }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		srv.close()
		fs.Shutdown()
		<-errc
		return nil
	}
}
