package flight

import (
	"context"
	"errors"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rllm-pipe/rllm-pipe/schemas/bearer"
)

// ErrNeedToken is Serve's refusal to listen beyond loopback without a
// token.
var ErrNeedToken = errors.New("refusing to serve beyond loopback without a token")

// role is what a call's bearer token allows.
type role int

const (
	roleOpen   role = iota // no token configured: loopback only
	roleMember             // the shared member token
	roleNamed              // a consumer's own token (Options.MemberTokens)
	roleAdmin              // the admin token: also every member's stats
)

// caller is who the auth interceptor found a call to come from: its role
// and, for roleNamed, the one consumer name its token is for.
type caller struct {
	role role
	name string
}

type callerKey struct{}

// callerOf is the caller the auth interceptor gave the call.
func callerOf(ctx context.Context) caller {
	c, _ := ctx.Value(callerKey{}).(caller)
	return c
}

// callRole is the role the auth interceptor gave the call.
func callRole(ctx context.Context) role { return callerOf(ctx).role }

// auth checks bearer tokens (bearer.Key: it holds their digests only).
type auth struct {
	member, admin bearer.Key
	named         map[string]bearer.Key // consumer name -> its own token
}

func newAuth(token, adminToken string, named map[string]string) *auth {
	a := &auth{member: bearer.NewKey(token), admin: bearer.NewKey(adminToken), named: map[string]bearer.Key{}}
	for name, tok := range named {
		a.named[name] = bearer.NewKey(tok)
	}
	return a
}

// enabled reports whether calls must carry a token.
func (a *auth) enabled() bool { return a.member.IsSet() || a.admin.IsSet() || len(a.named) > 0 }

// reserved reports whether name has its own token: only a call carrying
// that token streams under it.
func (a *auth) reserved(name string) bool {
	_, ok := a.named[name]
	return ok
}

// check returns ctx with the call's role, or Unauthenticated. The token
// is compared in constant time and never appears in an error or log.
func (a *auth) check(ctx context.Context) (context.Context, error) {
	if !a.enabled() {
		return context.WithValue(ctx, callerKey{}, caller{role: roleOpen}), nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) != 1 {
		return nil, status.Error(codes.Unauthenticated, "missing bearer token (authorization: Bearer TOKEN)")
	}
	token, ok := bearer.Parse(vals[0])
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "authorization is not a bearer token")
	}
	isAdmin, isMember := a.admin.Matches(token), a.member.Matches(token)
	named := ""
	for name, k := range a.named { // every key compared: the time tells nothing
		if k.Matches(token) {
			named = name
		}
	}
	switch {
	case isAdmin:
		return context.WithValue(ctx, callerKey{}, caller{role: roleAdmin}), nil
	case named != "":
		return context.WithValue(ctx, callerKey{}, caller{role: roleNamed, name: named}), nil
	case isMember:
		return context.WithValue(ctx, callerKey{}, caller{role: roleMember}), nil
	}
	return nil, status.Error(codes.Unauthenticated, "invalid bearer token")
}

func (a *auth) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, err := a.check(ctx)
	if err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (a *auth) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, err := a.check(ss.Context())
	if err != nil {
		return err
	}
	return handler(srv, roleStream{ServerStream: ss, ctx: ctx})
}

// roleStream is a server stream whose context carries the call's role.
type roleStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s roleStream) Context() context.Context { return s.ctx }

// loopback reports whether a bound address is reachable from this host
// only (127.0.0.0/8, ::1).
func loopback(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}
