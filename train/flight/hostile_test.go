package flight

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/flight"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/schemas/bearer/bearertest"
	"github.com/rllm-pipe/rllm-pipe/train"
)

// cfgGroup joins members with cfg (Name set per member).
type cfgGroup struct {
	sh  *local.Reader
	obj train.Objects
	cfg train.ConsumerConfig
}

func (g cfgGroup) Join(ctx context.Context, name string, t Ticket) (*train.Consumer, error) {
	cfg := g.cfg
	cfg.Name = name
	if t.PolicyVersion != nil {
		cfg.PolicyVersion = *t.PolicyVersion
	}
	if t.BatchGroups > 0 {
		cfg.BatchGroups = t.BatchGroups
	}
	return train.NewConsumer(ctx, g.sh, g.obj, cfg)
}

// newGroup opens root's consumer group "g"; maxStale and inflight as the
// trainer's flags.
func newGroup(t *testing.T, root string, maxStale int64, inflight int) cfgGroup {
	t.Helper()
	sh, err := local.OpenReader(root)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := sh.Objects(train.GroupDir("g"))
	if err != nil {
		t.Fatal(err)
	}
	return cfgGroup{sh: sh, obj: obj, cfg: train.ConsumerConfig{
		Config: train.Config{MaxStaleness: maxStale, IncludeFiltered: true},
		Poll:   10 * time.Millisecond, MaxInflight: inflight, LeaseTimeout: time.Minute,
	}}
}

// running is a Serve in a goroutine.
type running struct {
	addr string
	srv  *Server
	stop context.CancelFunc
	done chan error
}

// startServer serves g under opts on loopback; stopped at cleanup.
func startServer(t *testing.T, g Group, opts Options) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{srv: NewServer(g, opts), stop: cancel, done: make(chan error, 1)}
	addr := make(chan string, 1)
	go func() { r.done <- Serve(ctx, "127.0.0.1:0", r.srv, func(a string) { addr <- a }) }()
	select {
	case r.addr = <-addr:
	case err := <-r.done:
		t.Fatalf("serve: %v", err)
	}
	t.Cleanup(func() {
		r.srv.Abort()
		<-r.done
	})
	return r
}

// bearerCreds puts a token on every call.
type bearerCreds string

func (b bearerCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearerCreds) RequireTransportSecurity() bool { return false }

// dial is a Flight client of addr with token (if any) and TLS roots (nil:
// plaintext).
func dial(t *testing.T, addr, token string, roots *x509.CertPool) flight.Client {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if roots != nil {
		opts[0] = grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}))
	}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearerCreds(token)))
	}
	cli, err := flight.NewClientWithMiddleware(addr, nil, nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// act runs action kind with body and returns the reply.
func act(ctx context.Context, cli flight.Client, kind string, body any) ([]byte, error) {
	data, _ := json.Marshal(body)
	st, err := cli.DoAction(ctx, &flight.Action{Type: kind, Body: data})
	if err != nil {
		return nil, err
	}
	r, err := st.Recv()
	if err != nil {
		return nil, err
	}
	return r.Body, nil
}

// open starts a stream with ticket and reads its first batch's metadata.
func open(ctx context.Context, t *testing.T, cli flight.Client, ticket string) (*flight.Reader, BatchMeta) {
	t.Helper()
	stream, err := cli.DoGet(ctx, &flight.Ticket{Ticket: []byte(ticket)})
	if err != nil {
		t.Fatal(err)
	}
	rd, err := flight.NewRecordReader(stream)
	if err != nil {
		t.Fatalf("stream %s: %v", ticket, err)
	}
	t.Cleanup(rd.Release)
	if !rd.Next() {
		t.Fatalf("stream %s: no batch: %v", ticket, rd.Err())
	}
	var m BatchMeta
	if err := json.Unmarshal(rd.LatestAppMetadata(), &m); err != nil {
		t.Fatal(err)
	}
	return rd, m
}

func wantCode(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Errorf("%s: %v, want %v", what, err, code)
	}
}

// TestHostileClientCannotActForAnotherMember: a client learns nothing of
// other members and cannot acknowledge for them or move their policy
// version — not through an empty ack either — and versions out of range
// are refused.
func TestHostileClientCannotActForAnotherMember(t *testing.T) {
	root := t.TempDir()
	writeShards(t, root, 2, 6, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := startServer(t, newGroup(t, root, 0, 2), Options{AdminToken: "admin-token-0123456789"})
	victim := dial(t, r.addr, "admin-token-0123456789", nil)
	const vkey = "victim-key-0123456789"
	_, vm := open(ctx, t, victim, `{"consumer":"victim","key":"`+vkey+`"}`)
	if vm.Key != "" {
		t.Errorf("the server handed out a key the client chose")
	}
	attacker := dial(t, r.addr, "admin-token-0123456789", nil)
	// The attacker's own stream, with a key of its own.
	const akey = "attacker-key-0123456789"
	open(ctx, t, attacker, `{"consumer":"attacker","key":"`+akey+`"}`)

	for _, c := range []struct {
		name, kind string
		body       any
	}{
		{"set another member's version", "set_policy_version", map[string]any{"consumer": "victim", "policy_version": 1000}},
		{"set it with one's own key", "set_policy_version", map[string]any{"consumer": "victim", "key": akey, "policy_version": 1000}},
		{"publish a version as another member", "publish_policy_version", map[string]any{"consumer": "victim", "key": akey, "policy_version": 1000}},
		{"empty ack moving its version", "ack", map[string]any{"consumer": "victim", "batch_ids": []uint64{}, "policy_version": 1000}},
		{"empty ack with one's own key", "ack", map[string]any{"consumer": "victim", "key": akey, "batch_ids": []uint64{}, "policy_version": 1000}},
		{"ack its batch", "ack", map[string]any{"consumer": "victim", "member": vm.Member, "batch_ids": []uint64{vm.BatchID}}},
		{"its stats without its key", "stats", map[string]any{"consumer": "victim", "key": akey}},
	} {
		_, err := act(ctx, attacker, c.kind, c.body)
		wantCode(t, c.name, err, codes.PermissionDenied)
	}
	body, err := act(ctx, victim, "stats", map[string]any{"consumer": "victim", "key": vkey})
	if err != nil {
		t.Fatal(err)
	}
	var st train.Stats
	_ = json.Unmarshal(body, &st)
	if st.PolicyVersion != 0 || st.GroupsAcked != 0 {
		t.Errorf("the victim after the attacks: %+v", st)
	}

	// Versions out of range, from every door.
	huge := int64(1) << 60
	for _, c := range []struct {
		name, kind string
		body       any
	}{
		{"negative version", "set_policy_version", map[string]any{"consumer": "victim", "key": vkey, "policy_version": -1}},
		{"huge version", "set_policy_version", map[string]any{"consumer": "victim", "key": vkey, "policy_version": huge}},
		{"no version", "set_policy_version", map[string]any{"consumer": "victim", "key": vkey}},
		{"publish a negative version", "publish_policy_version", map[string]any{"consumer": "victim", "key": vkey, "policy_version": -1}},
		{"publish no version", "publish_policy_version", map[string]any{"consumer": "victim", "key": vkey}},
		{"ack with a negative version", "ack", map[string]any{"consumer": "victim", "key": vkey, "batch_ids": []uint64{}, "policy_version": -5}},
	} {
		_, err := act(ctx, victim, c.kind, c.body)
		wantCode(t, c.name, err, codes.InvalidArgument)
	}
	for _, tkt := range []string{`{"consumer":"neg","policy_version":-1}`, fmt.Sprintf(`{"consumer":"big","policy_version":%d}`, huge), `{"consumer":"short","key":"abc"}`,
		`{"consumer":"steps","batch_groups":-4}`, fmt.Sprintf(`{"consumer":"steps","batch_groups":%d}`, MaxTicketSteps+1),
		`{"consumer":"steps","versions_per_step":-1}`, fmt.Sprintf(`{"consumer":"steps","versions_per_step":%d}`, huge)} {
		s, err := victim.DoGet(ctx, &flight.Ticket{Ticket: []byte(tkt)})
		if err == nil {
			_, err = s.Recv()
		}
		wantCode(t, "ticket "+tkt, err, codes.InvalidArgument)
	}
	// The victim moves its own version; an empty ack with its key is fine.
	if _, err := act(ctx, victim, "set_policy_version", map[string]any{"consumer": "victim", "key": vkey, "policy_version": 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := act(ctx, victim, "ack", map[string]any{"consumer": "victim", "key": vkey, "batch_ids": []uint64{}, "policy_version": 4}); err != nil {
		t.Fatal(err)
	}
	body, _ = act(ctx, victim, "stats", map[string]any{"consumer": "victim", "key": vkey})
	_ = json.Unmarshal(body, &st)
	if st.PolicyVersion != 4 {
		t.Errorf("the victim's own version: %d, want 4", st.PolicyVersion)
	}

	// Without a key, stats need the admin token.
	root = t.TempDir()
	writeShards(t, root, 2, 2, 0)
	member := startServer(t, newGroup(t, root, -1, 2), Options{Token: "member-token-0123456789", AdminToken: "admin-token-0123456789"})
	mcli := dial(t, member.addr, "member-token-0123456789", nil)
	open(ctx, t, mcli, `{"consumer":"m0","key":"m0-key-0123456789abc"}`)
	for _, body := range []any{map[string]any{}, map[string]any{"consumer": "m0"}} {
		_, err := act(ctx, mcli, "stats", body)
		wantCode(t, fmt.Sprintf("stats %v with the member token", body), err, codes.PermissionDenied)
	}
	admin := dial(t, member.addr, "admin-token-0123456789", nil)
	body, err = act(ctx, admin, "stats", map[string]any{})
	if err != nil {
		t.Fatalf("stats of all with the admin token: %v", err)
	}
	var all map[string]train.Stats
	_ = json.Unmarshal(body, &all)
	if _, ok := all["m0"]; !ok || len(all) != 1 {
		t.Errorf("stats of all: %s", body)
	}
	// A server without tokens has no admin: nobody reads others' stats.
	open2 := startServer(t, newGroup(t, root, -1, 2), Options{})
	_, err = act(ctx, dial(t, open2.addr, "", nil), "stats", map[string]any{})
	wantCode(t, "stats of all without tokens", err, codes.PermissionDenied)
}

// TestServerMadeKey: a ticket without a key gets one in the first batch,
// and only that key acts on the stream.
func TestServerMadeKey(t *testing.T) {
	root := t.TempDir()
	writeShards(t, root, 1, 4, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := startServer(t, newGroup(t, root, -1, 2), Options{})
	cli := dial(t, r.addr, "", nil)
	rd, m := open(ctx, t, cli, `{"consumer":"t0"}`)
	if len(m.Key) < MinKeyLen {
		t.Fatalf("first batch's key %q", m.Key)
	}
	if _, err := act(ctx, cli, "ack", map[string]any{"consumer": "t0", "batch_ids": []uint64{m.BatchID}}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("ack without the key: %v", err)
	}
	if _, err := act(ctx, cli, "ack", map[string]any{"consumer": "t0", "key": m.Key, "batch_ids": []uint64{m.BatchID}}); err != nil {
		t.Errorf("ack with the server's key: %v", err)
	}
	if !rd.Next() {
		t.Fatal(rd.Err())
	}
	var next BatchMeta
	_ = json.Unmarshal(rd.LatestAppMetadata(), &next)
	if next.Key != "" {
		t.Errorf("the key was sent again")
	}
}

// TestTokens: with a token, every call without it or with a wrong one is
// refused, unary and stream alike.
func TestTokens(t *testing.T) {
	root := t.TempDir()
	writeShards(t, root, 2, 4, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := startServer(t, newGroup(t, root, -1, 2), Options{Token: "member-token-0123456789", AdminToken: "admin-token-0123456789"})
	for _, tok := range []string{"", "wrong-token", "member-token-012345678", "member-token-0123456789x"} {
		cli := dial(t, r.addr, tok, nil)
		_, err := cli.GetFlightInfo(ctx, &flight.FlightDescriptor{})
		wantCode(t, fmt.Sprintf("unary call with token %q", tok), err, codes.Unauthenticated)
		_, err = act(ctx, cli, "stats", map[string]any{})
		wantCode(t, fmt.Sprintf("action with token %q", tok), err, codes.Unauthenticated)
		s, err := cli.DoGet(ctx, &flight.Ticket{Ticket: []byte(`{"consumer":"x"}`)})
		if err == nil {
			_, err = s.Recv()
		}
		wantCode(t, fmt.Sprintf("stream with token %q", tok), err, codes.Unauthenticated)
	}
	for _, tok := range []string{"member-token-0123456789", "admin-token-0123456789"} {
		cli := dial(t, r.addr, tok, nil)
		_, err := cli.GetFlightInfo(ctx, &flight.FlightDescriptor{})
		wantCode(t, "unary call with a good token", err, codes.Unimplemented)
		open(ctx, t, cli, fmt.Sprintf(`{"consumer":"c%d","key":"key-0123456789abcdef"}`, len(tok)))
	}
}

// TestListenBeyondLoopback: without a token only loopback addresses are
// served.
func TestListenBeyondLoopback(t *testing.T) {
	root := t.TempDir()
	writeShards(t, root, 1, 1, 0)
	g := newGroup(t, root, -1, 2)
	for _, addr := range []string{"0.0.0.0:0", "[::]:0", ":0"} {
		ctx, cancel := context.WithCancel(context.Background())
		err := Serve(ctx, addr, NewServer(g, Options{}), func(string) { cancel() })
		cancel()
		if !errors.Is(err, ErrNeedToken) {
			t.Errorf("serve on %s without a token: %v, want ErrNeedToken", addr, err)
		}
	}
	for _, c := range []struct {
		addr string
		opts Options
	}{
		{"localhost:0", Options{}},
		{"127.0.0.1:0", Options{}},
		{"0.0.0.0:0", Options{Token: "member-token-0123456789"}},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		err := Serve(ctx, c.addr, NewServer(g, c.opts), func(string) { cancel() })
		cancel()
		if err != nil {
			t.Errorf("serve on %s: %v", c.addr, err)
		}
	}
}

// selfSigned makes a certificate for 127.0.0.1 and the pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rllm-pipe test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

// TestTLS: with a certificate the server speaks TLS only.
func TestTLS(t *testing.T) {
	root := t.TempDir()
	writeShards(t, root, 1, 2, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cert, pool := selfSigned(t)
	r := startServer(t, newGroup(t, root, -1, 2), Options{Token: "member-token-0123456789", TLS: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}})
	open(ctx, t, dial(t, r.addr, "member-token-0123456789", pool), `{"consumer":"tls","key":"key-0123456789abcdef"}`)
	plain := dial(t, r.addr, "member-token-0123456789", nil)
	if _, err := act(ctx, plain, "stats", map[string]any{}); status.Code(err) != codes.Unavailable {
		t.Errorf("a plaintext client of a TLS server: %v", err)
	}
}

// drainAll reads every batch as a trainer does, acknowledging each, and
// returns the groups; a refused start (the server is full) is retried.
func drainAll(ctx context.Context, t *testing.T, cli flight.Client, name string) []string {
	t.Helper()
	key := name + "-key-0123456789abcdef"
	for {
		stream, err := cli.DoGet(ctx, &flight.Ticket{Ticket: []byte(`{"consumer":"` + name + `","key":"` + key + `"}`)})
		if err != nil {
			t.Fatal(err)
		}
		rd, err := flight.NewRecordReader(stream)
		if status.Code(err) == codes.ResourceExhausted && ctx.Err() == nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatalf("trainer: %v", err)
		}
		defer rd.Release()
		var groups []string
		for rd.Next() {
			var m BatchMeta
			_ = json.Unmarshal(rd.LatestAppMetadata(), &m)
			groups = append(groups, m.Groups...)
			if _, err := act(ctx, cli, "ack", map[string]any{"consumer": name, "key": key, "batch_ids": []uint64{m.BatchID}}); err != nil {
				t.Fatalf("trainer's ack: %v", err)
			}
		}
		if rd.Err() != nil {
			t.Fatalf("trainer: %v", rd.Err())
		}
		return groups
	}
}

// TestIdleStreamsAreBoundedAndDropped: of 1,000 streams that never read,
// MaxStreams are accepted and the rest refused at once; the accepted ones
// are dropped when they acknowledge nothing, and a real trainer gets every
// group.
func TestIdleStreamsAreBoundedAndDropped(t *testing.T) {
	root := t.TempDir()
	writeShards(t, root, 4, 5, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const limit = 8
	r := startServer(t, newGroup(t, root, -1, 2), Options{MaxStreams: limit, AckTimeout: 500 * time.Millisecond})
	var (
		mu       sync.Mutex
		codesOf  = map[codes.Code]int{}
		wg       sync.WaitGroup
		maxLive  int
		idleDone = make(chan struct{})
	)
	go func() { // the server never holds more than limit streams
		for {
			select {
			case <-idleDone:
				return
			case <-time.After(time.Millisecond):
			}
			r.srv.mu.Lock()
			n := len(r.srv.members)
			r.srv.mu.Unlock()
			mu.Lock()
			maxLive = max(maxLive, n)
			mu.Unlock()
		}
	}()
	conns := make([]flight.Client, 10)
	for i := range conns {
		conns[i] = dial(t, r.addr, "", nil)
	}
	// Open 1,000 streams that never read a batch: Header waits for the
	// server's first word (a refusal ends the stream without one).
	var accepted []flight.FlightService_DoGetClient
	for i := 0; i < 1000; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := conns[i%len(conns)].DoGet(ctx, &flight.Ticket{Ticket: []byte(fmt.Sprintf(`{"consumer":"idle-%d"}`, i))})
			var md metadata.MD
			if err == nil {
				md, err = s.Header()
			}
			if err == nil && md == nil {
				_, err = s.Recv()
			}
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				accepted = append(accepted, s)
				return
			}
			codesOf[status.Code(err)]++
		}()
	}
	wg.Wait()
	groups := drainAll(ctx, t, dial(t, r.addr, "", nil), "trainer")
	close(idleDone)
	mu.Lock()
	defer mu.Unlock()
	for _, s := range accepted { // now read: batches, then the drop
		_, err := s.Recv()
		for err == nil {
			_, err = s.Recv()
		}
		codesOf[status.Code(err)]++
	}
	t.Logf("idle streams: %d accepted, ended with %v", len(accepted), codesOf)
	if len(groups) != 20 {
		t.Errorf("the trainer got %d groups, want 20", len(groups))
	}
	if maxLive > limit {
		t.Errorf("%d streams at once, limit %d", maxLive, limit)
	}
	if codesOf[codes.ResourceExhausted] < 1000-4*limit {
		t.Errorf("idle streams ended with %v: want most refused (ResourceExhausted)", codesOf)
	}
	if codesOf[codes.DeadlineExceeded] == 0 {
		t.Errorf("idle streams ended with %v: want the accepted ones dropped (DeadlineExceeded)", codesOf)
	}
}

// idleStream opens a stream that never reads a batch and waits until the
// server accepted it.
func idleStream(ctx context.Context, t *testing.T, cli flight.Client, name string) {
	t.Helper()
	s, err := cli.DoGet(ctx, &flight.Ticket{Ticket: []byte(`{"consumer":"` + name + `"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if md, err := s.Header(); err != nil || md == nil {
		t.Fatalf("idle stream not accepted: %v", err)
	}
}

// TestReaderThatStopsIsDropped: a client that stops reading (its window
// full) is dropped after the send timeout, and its shards go to a real
// trainer.
func TestReaderThatStopsIsDropped(t *testing.T) {
	root := t.TempDir()
	writeShards(t, root, 1, 32, 1<<18) // 32 batches of 1 MiB
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The timeout is also the most a busy machine may delay the trainer's
	// reads (it too is dropped if a send waits longer): at 300 ms a test
	// run beside the race-enabled suite dropped the trainer as well.
	r := startServer(t, newGroup(t, root, -1, 100), Options{SendTimeout: 2 * time.Second, AckTimeout: -1})
	idleStream(ctx, t, dial(t, r.addr, "", nil), "stuck")
	groups := drainAll(ctx, t, dial(t, r.addr, "", nil), "trainer")
	if len(groups) != 32 {
		t.Errorf("the trainer got %d groups, want 32", len(groups))
	}
}

// TestStreamBytesBound: a stream waits for acknowledgements once its
// batches in flight reach MaxStreamBytes.
func TestStreamBytesBound(t *testing.T) {
	root := t.TempDir()
	writeShards(t, root, 1, 8, 1<<18)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r := startServer(t, newGroup(t, root, -1, 100), Options{MaxStreamBytes: 5 << 19}) // 2.5 MiB
	cli := dial(t, r.addr, "", nil)
	sctx, cancelStream := context.WithCancel(ctx)
	rd, first := open(sctx, t, cli, `{"consumer":"t0","key":"key-0123456789abcdef"}`)
	got := make(chan BatchMeta, 8)
	go func() {
		for rd.Next() {
			var m BatchMeta
			_ = json.Unmarshal(rd.LatestAppMetadata(), &m)
			got <- m
		}
		close(got)
	}()
	count := func() int {
		time.Sleep(500 * time.Millisecond)
		return len(got) + 1
	}
	if n := count(); n != 3 {
		t.Errorf("%d batches of 1 MiB in flight under a 2 MiB bound, want 3", n)
	}
	if _, err := act(ctx, cli, "ack", map[string]any{"consumer": "t0", "key": "key-0123456789abcdef", "batch_ids": []uint64{first.BatchID}}); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 4 {
		t.Errorf("%d batches after one acknowledgement, want 4", n)
	}
	cancelStream()
	for range got { // the reader is done before the cleanup releases it
	}
}

// TestShutdownWithStuckReader: Serve returns within the grace although a
// client stopped reading mid-batch.
func TestShutdownWithStuckReader(t *testing.T) {
	root := t.TempDir()
	writeShards(t, root, 1, 32, 1<<18)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r := startServer(t, newGroup(t, root, -1, 100), Options{SendTimeout: time.Hour, AckTimeout: -1, ShutdownGrace: 500 * time.Millisecond})
	idleStream(ctx, t, dial(t, r.addr, "", nil), "stuck")
	time.Sleep(time.Second) // the server's send blocks on the full window
	if d := stoppedWithin(t, r, r.stop); d > 5*time.Second {
		t.Errorf("serve stopped after %v, grace 500 ms", d)
	}
}

// stoppedWithin calls stop and waits for r's Serve to return (failing
// after 20 s); it returns how long that took.
func stoppedWithin(t *testing.T, r *running, stop func()) time.Duration {
	t.Helper()
	start := time.Now()
	stop()
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatal(err)
		}
		r.done <- nil // for the cleanup
	case <-time.After(20 * time.Second):
		t.Fatal("serve still running 20 s after its stop")
	}
	return time.Since(start)
}

// TestStreamsPerConnection: one connection cannot take every slot.
func TestStreamsPerConnection(t *testing.T) {
	root := t.TempDir()
	writeShards(t, root, 40, 1, 0) // enough for the hog's streams to leave some
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := startServer(t, newGroup(t, root, -1, 2), Options{MaxStreams: 16, MaxStreamsPerConn: 3})
	hog := dial(t, r.addr, "", nil)
	accepted, refused := 0, 0
	for i := 0; i < 20; i++ {
		s, err := hog.DoGet(ctx, &flight.Ticket{Ticket: []byte(fmt.Sprintf(`{"consumer":"hog-%d"}`, i))})
		if err != nil {
			t.Fatal(err)
		}
		switch md, err := s.Header(); {
		case err == nil && md != nil:
			accepted++
		default:
			if _, err := s.Recv(); status.Code(err) == codes.ResourceExhausted {
				refused++
			}
		}
	}
	if accepted != 3 || refused != 17 {
		t.Errorf("one connection: %d streams accepted, %d refused; want 3 and 17", accepted, refused)
	}
	open(ctx, t, dial(t, r.addr, "", nil), `{"consumer":"trainer","key":"key-0123456789abcdef"}`)
}

// TestRejoinWhileTheOldStreamEnds: a trainer that drops its stream and
// reconnects at once under the same name gets in once the server sees the
// drop, even when the new stream arrives first (another connection); with
// no wait, it is refused.
func TestRejoinWhileTheOldStreamEnds(t *testing.T) {
	for _, tc := range []struct {
		wait time.Duration
		want codes.Code
	}{{0, codes.OK}, {-1, codes.AlreadyExists}} {
		t.Run(fmt.Sprint(tc.wait), func(t *testing.T) {
			root := t.TempDir()
			writeShard(t, root, 4)
			r := startServer(t, newGroup(t, root, 0, 1), Options{RejoinWait: tc.wait})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			oldCtx, drop := context.WithCancel(ctx)
			open(oldCtx, t, dial(t, r.addr, "", nil), `{"consumer":"trainer","key":"old-key-0123456789"}`)
			// The new stream is in before the old one is dropped.
			got := make(chan error, 1)
			cli := dial(t, r.addr, "", nil)
			go func() {
				stream, err := cli.DoGet(ctx, &flight.Ticket{Ticket: []byte(`{"consumer":"trainer","key":"new-key-0123456789"}`)})
				if err == nil {
					_, err = stream.Recv()
				}
				got <- err
			}()
			time.Sleep(300 * time.Millisecond)
			drop()
			wantCode(t, "rejoin", <-got, tc.want)
		})
	}
}

// dialFrom is a Flight client of addr whose connections come from the
// local address ip (another loopback address: another client host).
func dialFrom(t *testing.T, addr, ip string) flight.Client {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	cli, err := flight.NewClientWithMiddleware(addr, nil, nil,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// TestOneHostCannotTakeEverySlot, with the default limits and timeouts:
// a client host opening 20 connections of 4 streams that never read gets
// MaxStreamsPerHost (16) of them; a trainer on another host gets in at
// once, and one on the hog's own host evicts, once SendTimeout (30 s)
// has passed, a stream that acknowledged nothing.
func TestOneHostCannotTakeEverySlot(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out the default send timeout")
	}
	root := t.TempDir()
	writeShards(t, root, 60, 1, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	r := startServer(t, newGroup(t, root, -1, 2), Options{})
	var hog []flight.FlightService_DoGetClient
	refused := 0
	for c := range 20 {
		cli := dial(t, r.addr, "", nil)
		for i := range 4 {
			s, err := cli.DoGet(ctx, &flight.Ticket{Ticket: []byte(fmt.Sprintf(`{"consumer":"hog-%d-%d"}`, c, i))})
			if err != nil {
				t.Fatal(err)
			}
			if md, err := s.Header(); err == nil && md != nil {
				hog = append(hog, s)
				continue
			}
			if _, err := s.Recv(); status.Code(err) == codes.ResourceExhausted {
				refused++
			}
		}
	}
	if len(hog) != 16 || refused != 64 {
		t.Fatalf("one host: %d streams accepted, %d refused; want 16 and 64", len(hog), refused)
	}
	// Another host is not locked out.
	open(ctx, t, dialFrom(t, r.addr, "127.0.0.2"), `{"consumer":"remote","key":"key-0123456789abcdef"}`)
	// The hog's host is full: a trainer there waits for an eviction.
	start := time.Now()
	local := dial(t, r.addr, "", nil)
	for {
		s, err := local.DoGet(ctx, &flight.Ticket{Ticket: []byte(`{"consumer":"trainer","key":"key-0123456789abcdef"}`)})
		if err != nil {
			t.Fatal(err)
		}
		rd, err := flight.NewRecordReader(s)
		if status.Code(err) == codes.ResourceExhausted && ctx.Err() == nil {
			time.Sleep(time.Second)
			continue
		}
		if err != nil {
			t.Fatalf("trainer on the full host: %v", err)
		}
		rd.Release()
		break
	}
	waited := time.Since(start)
	t.Logf("the trainer on the hog's host got in after %s", waited)
	if waited > 45*time.Second {
		t.Errorf("the trainer waited %s, want about the send timeout (30 s)", waited)
	}
	r.srv.mu.Lock()
	onHost, trainer := 0, false
	for name, m := range r.srv.members {
		if m != nil && m.host == "127.0.0.1" {
			onHost++
			trainer = trainer || name == "trainer"
		}
	}
	r.srv.mu.Unlock()
	if onHost != 16 || !trainer {
		t.Errorf("%d streams of the hog's host after the eviction (trainer among them: %v), want 16: 15 of the hog and the trainer", onHost, trainer)
	}
}

// TestTokensSuite: the bearer header rule every server shares, on a
// unary action.
func TestTokensSuite(t *testing.T) {
	root := t.TempDir()
	writeShards(t, root, 1, 1, 0)
	r := startServer(t, newGroup(t, root, -1, 2), Options{AdminToken: bearertest.Token})
	cli := dial(t, r.addr, "", nil)
	bearertest.Run(t, func(t *testing.T, header string) bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if header != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", header)
		}
		_, err := act(ctx, cli, "stats", map[string]any{})
		if status.Code(err) != codes.Unauthenticated && err != nil {
			t.Fatalf("stats: %v", err)
		}
		return err == nil
	})
}

// TestShutdownWithSilentConnection: a TCP connection that never sends a
// byte (its handshake would wait for gRPC's connection timeout) holds
// neither a graceful stop past its grace nor an abort.
func TestShutdownWithSilentConnection(t *testing.T) {
	root := t.TempDir()
	writeShards(t, root, 1, 1, 0)
	for _, abort := range []bool{false, true} {
		t.Run(fmt.Sprintf("abort=%v", abort), func(t *testing.T) {
			r := startServer(t, newGroup(t, root, -1, 2), Options{ShutdownGrace: 300 * time.Millisecond})
			silent, err := net.Dial("tcp", r.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer silent.Close()
			time.Sleep(200 * time.Millisecond) // accepted, handshaking
			stop := r.stop
			if abort {
				stop = r.srv.Abort
			}
			// gRPC's handshake timeout is 10 s; the grace 300 ms.
			if d := stoppedWithin(t, r, stop); d > 5*time.Second {
				t.Errorf("serve stopped after %v with a silent connection open, grace 300 ms", d.Round(time.Millisecond))
			}
		})
	}
}

const (
	sharedToken  = "shared-token-0123456789"
	trainerToken = "trainer-token-0123456789"
)

// TestMemberTokenNames: a consumer with its own token streams under its
// name only (an empty name is its name), and nobody else streams under it,
// the shared and the admin token included.
func TestMemberTokenNames(t *testing.T) {
	root := t.TempDir()
	writeShards(t, root, 2, 4, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := startServer(t, newGroup(t, root, -1, 2), Options{Token: sharedToken, AdminToken: "admin-token-0123456789",
		MemberTokens: map[string]string{"trainer": trainerToken}})
	refused := func(tok, ticket string) {
		t.Helper()
		s, err := dial(t, r.addr, tok, nil).DoGet(ctx, &flight.Ticket{Ticket: []byte(ticket)})
		if err == nil {
			_, err = s.Recv()
		}
		wantCode(t, fmt.Sprintf("%s with token %.7s", ticket, tok), err, codes.PermissionDenied)
	}
	refused(sharedToken, `{"consumer":"trainer"}`)
	refused("admin-token-0123456789", `{"consumer":"trainer"}`)
	refused(trainerToken, `{"consumer":"other"}`)
	_, m := open(ctx, t, dial(t, r.addr, trainerToken, nil), `{"key":"key-0123456789abcdef"}`)
	if m.Consumer != "trainer" {
		t.Errorf("a stream with the trainer's token and no name streams as %q, want trainer", m.Consumer)
	}
	_, err := act(ctx, dial(t, r.addr, trainerToken, nil), "stats", map[string]any{})
	wantCode(t, "every member's stats with a member's own token", err, codes.PermissionDenied)
	open(ctx, t, dial(t, r.addr, sharedToken, nil), `{"consumer":"other","key":"key-0123456789abcdef"}`)
}

// TestMemberTokenOutlastsAFlood: a client with the shared token opening
// streams that never read as fast as it can, from the trainer's own host,
// keeps that host full; a trainer with its own token gets in at once, is
// never evicted before its first acknowledgement, and reads every group
// on one stream.
func TestMemberTokenOutlastsAFlood(t *testing.T) {
	root := t.TempDir()
	writeShards(t, root, 20, 1, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r := startServer(t, newGroup(t, root, -1, 2), Options{Token: sharedToken, MemberTokens: map[string]string{"trainer": trainerToken},
		MaxStreams: 8, MaxStreamsPerHost: 4, SendTimeout: 200 * time.Millisecond})
	floodCtx, stopFlood := context.WithCancel(ctx)
	var (
		flood     sync.WaitGroup
		mu        sync.Mutex
		floodEnds = map[codes.Code]int{}
	)
	for w := range 4 {
		flood.Add(1)
		go func() {
			defer flood.Done()
			cli := dial(t, r.addr, sharedToken, nil)
			for i := 0; floodCtx.Err() == nil; i++ {
				s, err := cli.DoGet(floodCtx, &flight.Ticket{Ticket: []byte(fmt.Sprintf(`{"consumer":"hog-%d-%d"}`, w, i))})
				if err == nil {
					if md, herr := s.Header(); herr == nil && md != nil {
						continue // accepted: it never reads
					}
					_, err = s.Recv()
				}
				mu.Lock()
				floodEnds[status.Code(err)]++
				mu.Unlock()
			}
		}()
	}
	time.Sleep(500 * time.Millisecond) // the host is full and churning

	start := time.Now()
	cli := dial(t, r.addr, trainerToken, nil)
	stream, err := cli.DoGet(ctx, &flight.Ticket{Ticket: []byte(`{"consumer":"trainer","key":"key-0123456789abcdef"}`)})
	if err != nil {
		t.Fatal(err)
	}
	rd, err := flight.NewRecordReader(stream)
	if err != nil {
		t.Fatalf("the trainer with its own token, on a flooded host: %v", err)
	}
	defer rd.Release()
	groups, first := 0, time.Duration(0)
	for rd.Next() {
		if first == 0 {
			first = time.Since(start)
			time.Sleep(time.Second) // a slow first step: 5 send timeouts
		}
		var m BatchMeta
		_ = json.Unmarshal(rd.LatestAppMetadata(), &m)
		groups += len(m.Groups)
		if _, err := act(ctx, cli, "ack", map[string]any{"consumer": "trainer", "key": "key-0123456789abcdef", "batch_ids": []uint64{m.BatchID}}); err != nil {
			t.Fatalf("trainer's ack: %v", err)
		}
	}
	stopFlood()
	flood.Wait()
	if rd.Err() != nil {
		t.Fatalf("the trainer's stream ended with %v after %d groups", rd.Err(), groups)
	}
	t.Logf("trainer: first batch after %s, %d groups in %s; the flood's refused or dropped streams: %v", first, groups, time.Since(start), floodEnds)
	if groups != 20 {
		t.Errorf("the trainer read %d groups on its one stream, want 20", groups)
	}
	if first > 5*time.Second {
		t.Errorf("the trainer's first batch came after %s under the flood", first)
	}
	if floodEnds[codes.ResourceExhausted] == 0 {
		t.Errorf("the flood was never refused (%v): the host was not full, the test shows nothing", floodEnds)
	}
}
