package main

import (
	"net"
	"time"
)

// idleTimeout closes a keep-alive connection of the commands' HTTP servers
// (gateway, ui) after this long without a request: without it an idle
// connection, authenticated or not, is held for ever. Clients reconnect on
// their next request. (ingest's /metrics has its own: metrics.IdleTimeout.)
const idleTimeout = 2 * time.Minute

// metricsToken is the token ingest's /metrics on addr requires: from file,
// else $RLLM_PIPE_METRICS_TOKEN. Beyond loopback one is required, of at
// least minTokenLen bytes, as for every other server.
func metricsToken(addr, file string) (string, error) {
	tok, err := token("metrics-token-file", file, "RLLM_PIPE_METRICS_TOKEN")
	if err != nil {
		return "", err
	}
	if host, _, _ := net.SplitHostPort(addr); host == "localhost" || loopbackAddr(addr) {
		return tok, nil
	}
	if tok == "" {
		return "", usageErrorf("--metrics-addr %s is beyond loopback: it needs a token (--metrics-token-file or RLLM_PIPE_METRICS_TOKEN), or listen on 127.0.0.1", addr)
	}
	return tok, shortToken(addr, tokenFlag{"metrics-token-file", "RLLM_PIPE_METRICS_TOKEN", tok})
}
