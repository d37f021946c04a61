package flight

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"net"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// ErrNeedToken is Serve's refusal to listen beyond loopback without a
// token.
var ErrNeedToken = errors.New("refusing to serve beyond loopback without a token")

// role is what a call's bearer token allows.
type role int

const (
	roleOpen   role = iota // no token configured: loopback only
	roleMember             // the member token
	roleAdmin              // the admin token: also every member's stats
)

type roleKey struct{}

// callRole is the role the auth interceptor gave the call.
func callRole(ctx context.Context) role {
	r, _ := ctx.Value(roleKey{}).(role)
	return r
}

// auth checks bearer tokens. It holds their digests only.
type auth struct {
	member, admin *[sha256.Size]byte
}

func newAuth(token, adminToken string) *auth {
	a := &auth{}
	if token != "" {
		d := sha256.Sum256([]byte(token))
		a.member = &d
	}
	if adminToken != "" {
		d := sha256.Sum256([]byte(adminToken))
		a.admin = &d
	}
	return a
}

// enabled reports whether calls must carry a token.
func (a *auth) enabled() bool { return a.member != nil || a.admin != nil }

// check returns ctx with the call's role, or Unauthenticated. The token
// is compared in constant time (digest against digest, so its length
// does not show either) and never appears in an error or log.
func (a *auth) check(ctx context.Context) (context.Context, error) {
	if !a.enabled() {
		return context.WithValue(ctx, roleKey{}, roleOpen), nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) != 1 {
		return nil, status.Error(codes.Unauthenticated, "missing bearer token (authorization: Bearer TOKEN)")
	}
	scheme, token, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return nil, status.Error(codes.Unauthenticated, "authorization is not a bearer token")
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(token)))
	isAdmin, isMember := 0, 0
	if a.admin != nil {
		isAdmin = subtle.ConstantTimeCompare(got[:], a.admin[:])
	}
	if a.member != nil {
		isMember = subtle.ConstantTimeCompare(got[:], a.member[:])
	}
	switch {
	case isAdmin == 1:
		return context.WithValue(ctx, roleKey{}, roleAdmin), nil
	case isMember == 1:
		return context.WithValue(ctx, roleKey{}, roleMember), nil
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
