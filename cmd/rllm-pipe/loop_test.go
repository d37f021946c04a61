package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/flight"

	trainflight "github.com/rllm-pipe/rllm-pipe/train/flight"
)

// TestLoopBinaries: gateway and serve on one shard root close the loop
// without glue. The gateway paces (one group per step, on-policy): a
// second group's first call is refused while the first is in the pipe,
// and admitted once the trainer consumed it; the version the trainer
// publishes through serve stamps the gateway's calls within a poll.
func TestLoopBinaries(t *testing.T) {
	t.Parallel()
	bin := e2eBinary(t)
	fixtures, stub := gwStub(t)
	root := filepath.Join(t.TempDir(), "data")
	g := startGateway(t, bin, e2eEnv(), "--upstream", stub.URL, "--to", root, "--group-size", "2", "--flush-interval", "100ms",
		"--groups-per-step", "1", "--max-staleness", "0", "--pace-wait", "300ms", "--trainer-poll", "50ms")
	client := &http.Client{Timeout: time.Minute}
	call := func(sid string) int {
		t.Helper()
		f := fixtures["vllm_chat"]
		req, _ := http.NewRequest(http.MethodPost, g.base+"/sessions/"+sid+f.Path, strings.NewReader(string(f.Request)))
		req.Header.Set("X-Fixture", f.Name)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, sid := range []string{"a:0", "a:1"} {
		if code := call(sid); code != 200 {
			t.Fatalf("%s: %d", sid, code)
		}
		gwPost(t, client, g.base+"/sessions/"+sid+"/finish", `{"reward":1}`)
	}
	if code := call("b:0"); code != http.StatusTooManyRequests {
		t.Fatalf("a second group while the first is in the pipe: %d, want 429", code)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := ln.Addr().String()
	ln.Close()
	p := startServe(t, bin, root, nil, "--follow", "--metrics-addr", metricsAddr)
	cli := serveClient(t, p.addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const key = "trainer-key-0123456789abcdef"
	stream, err := cli.DoGet(ctx, &flight.Ticket{Ticket: []byte(`{"consumer":"trainer","key":"` + key + `"}`)})
	if err != nil {
		t.Fatal(err)
	}
	rd, err := flight.NewRecordReader(stream)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Release()
	if !rd.Next() {
		t.Fatalf("no batch: %v", rd.Err())
	}
	var m trainflight.BatchMeta
	_ = json.Unmarshal(rd.LatestAppMetadata(), &m)
	action := func(kind string, body map[string]any) {
		t.Helper()
		b, _ := json.Marshal(body)
		res, err := cli.DoAction(ctx, &flight.Action{Type: kind, Body: b})
		if err == nil {
			_, err = res.Recv()
		}
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
	}
	action("ack", map[string]any{"consumer": "trainer", "key": key, "batch_ids": []uint64{m.BatchID}, "policy_version": 1})
	action("publish_policy_version", map[string]any{"consumer": "trainer", "key": key, "policy_version": 1})
	deadline := time.Now().Add(10 * time.Second)
	for {
		v := gwWeightVersion(t, client, g.base)
		if v == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway's weight version is %d 10 s after the trainer published 1\n%s", v, g.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The first group was consumed: the second is admitted now.
	if code := call("b:0"); code != 200 {
		t.Fatalf("the second group once the first was consumed: %d, want 200\n%s", code, g.stderr.String())
	}
	resp, err := client.Get(g.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"rllm_gateway_pace_refused_total 1", "rllm_gateway_weight_version 1"} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
	// serve's metrics: the trainer's group, its age when delivered, its
	// stall.
	resp, err = client.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`rllm_serve_groups_acked_total{consumer="trainer"} 1`, `rllm_serve_freshness_groups_total{consumer="trainer"} 1`,
		`rllm_serve_policy_version{consumer="trainer"} 1`, `rllm_serve_freshness_seconds{consumer="trainer",quantile="0.99"}`, `rllm_serve_data_stall_ratio{consumer="trainer"}`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("serve's metrics lack %q:\n%s", want, body)
		}
	}
	g.stop(t)
}
