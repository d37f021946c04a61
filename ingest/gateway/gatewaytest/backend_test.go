package gatewaytest

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestReplayEveryFixture(t *testing.T) {
	fx, err := Load("../testdata")
	if err != nil {
		t.Fatal(err)
	}
	b := NewBackend(fx)
	srv := httptest.NewServer(b)
	defer srv.Close()
	for _, name := range Names(fx) {
		f := fx[name]
		t.Run(name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", srv.URL+f.Path, strings.NewReader(string(f.Request)))
			req.Header.Set("X-Fixture", name)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if !f.Streaming() {
				body, _ := io.ReadAll(resp.Body)
				if string(body) != string(f.Response) {
					t.Fatalf("body differs")
				}
				return
			}
			var got []string
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
					got = append(got, d)
				}
			}
			if len(got) != len(f.SSEData) || got[len(got)-1] != "[DONE]" {
				t.Fatalf("got %d events, want %d ending in [DONE]", len(got), len(f.SSEData))
			}
			for _, d := range got[:len(got)-1] {
				if !json.Valid([]byte(d)) {
					t.Fatalf("event not JSON: %s", d)
				}
			}
		})
	}
	if b.Calls() != int64(len(fx)) {
		t.Fatalf("calls %d, want %d", b.Calls(), len(fx))
	}
}

func TestFailAndCut(t *testing.T) {
	fx, err := Load("../testdata")
	if err != nil {
		t.Fatal(err)
	}
	b := NewBackend(fx)
	srv := httptest.NewServer(b)
	defer srv.Close()
	b.FailNext(1, 503)
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	b.CutNextStream(2)
	resp, err = http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"x","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Fatal("a cut stream read to the end without error")
	}
}
