package gateway

import (
	"fmt"
	"net/http"
	"path"
	"strings"
)

// DefaultForward is what the gateway forwards upstream besides the
// recorded endpoints: listing the served models and embeddings. An
// inference server's other /v1 routes (vLLM's /v1/load_lora_adapter and
// /v1/unload_lora_adapter, for one) change the server every agent shares,
// and the gateway calls them with the upstream key: an agent reaches
// them only where Config.Forward says so.
var DefaultForward = []string{"GET /v1/models", "GET /v1/models/*", "POST /v1/embeddings"}

// route is one entry of Config.Forward: "[METHOD ]/v1/path", the path
// ending in "/*" for every path below it, or "*" for every route.
type route struct {
	method string // "" for any
	path   string
	prefix bool
}

// ValidateForward reports what is wrong with routes for Config.Forward.
func ValidateForward(routes []string) error {
	_, err := parseRoutes(routes)
	return err
}

// parseRoutes parses Config.Forward.
func parseRoutes(specs []string) ([]route, error) {
	var out []route
	for _, given := range specs {
		spec := strings.TrimSpace(given)
		if spec == "*" {
			out = append(out, route{path: "/", prefix: true})
			continue
		}
		var r route
		if m, p, ok := strings.Cut(spec, " "); ok {
			r.method, spec = strings.ToUpper(m), strings.TrimSpace(p)
			if !validMethod(r.method) {
				return nil, fmt.Errorf("gateway: forward %q: %q is not an HTTP method", given, m)
			}
		}
		if p, ok := strings.CutSuffix(spec, "/*"); ok {
			spec, r.prefix = p+"/", true
		}
		if spec != "/v1" && !strings.HasPrefix(spec, "/v1/") && spec != "/generate" {
			return nil, fmt.Errorf("gateway: forward %q: a route is \"[METHOD ]/v1/...\" (a trailing /* for every path below), or \"*\"", given)
		}
		r.path = spec
		out = append(out, r)
	}
	return out, nil
}

func validMethod(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions:
		return true
	}
	return false
}

// forwards reports whether an unrecorded call of method to tail (the
// path after a session's prefix) goes upstream. The recorded endpoints
// always do (outside a session they are forwarded unrecorded).
func (s *Server) forwards(method, tail string) bool {
	if clean := path.Clean(tail); clean != tail && clean+"/" != tail || strings.ContainsAny(tail, "\\%") {
		// Dot segments, doubled slashes, a backslash (a slash to some
		// servers), a % (what was encoded twice): no way around a route.
		return false
	}
	if method == http.MethodPost && endpointOf(tail) != "" {
		return true
	}
	for _, r := range s.forward {
		if r.method != "" && r.method != method && (r.method != http.MethodGet || method != http.MethodHead) {
			continue
		}
		if tail == r.path || r.prefix && strings.HasPrefix(tail, r.path) {
			return true
		}
	}
	return false
}
