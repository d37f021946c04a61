package transform

import (
	"fmt"
	"strings"

	"github.com/rllm-pipe/rllm-pipe/ingest"
)

// Filter marks trajectories that trainers should skip; nothing is
// dropped: marked rows still land in shards with a filter_reason.
type Filter struct {
	// Name is the reason written to filter_reason.
	Name string
	kind filterKind
	set  map[string]bool // termination reasons, for kindTermination
}

type filterKind uint8

const (
	kindZeroVariance filterKind = iota + 1 // every reward in the group equal
	kindTruncated                          // a step ended with finish_reason "length"
	kindTermination                        // termination_reason in a set
)

// ParseFilters reads --filter: a comma-separated list of zero-variance,
// truncated and termination=R1|R2|....
func ParseFilters(spec string) ([]Filter, error) {
	var out []Filter
	for _, f := range strings.Split(spec, ",") {
		f = strings.TrimSpace(f)
		switch {
		case f == "":
		case f == "zero-variance":
			out = append(out, Filter{Name: "zero_variance", kind: kindZeroVariance})
		case f == "truncated":
			out = append(out, Filter{Name: "truncated", kind: kindTruncated})
		case strings.HasPrefix(f, "termination="):
			set := map[string]bool{}
			for _, r := range strings.Split(strings.TrimPrefix(f, "termination="), "|") {
				if r = strings.TrimSpace(r); r != "" {
					// As stored: rLLM's reasons in any case (timeout) match.
					set[ingest.CanonicalTermination([]byte(r))] = true
				}
			}
			if len(set) == 0 {
				return nil, fmt.Errorf("filter %q: no termination reason", f)
			}
			out = append(out, Filter{Name: "termination", kind: kindTermination, set: set})
		default:
			return nil, fmt.Errorf("unknown filter %q (have zero-variance, truncated, termination=R1|R2)", f)
		}
	}
	return out, nil
}

// reasons returns the filter_reason of trajectory t in group g ("" when
// no filter matches); zeroVar tells whether g's rewards are all equal.
func reasons(filters []Filter, t *Trajectory, zeroVar bool) string {
	var r string
	for _, f := range filters {
		hit := false
		switch f.kind {
		case kindZeroVariance:
			hit = zeroVar
		case kindTruncated:
			for _, s := range t.Steps {
				if s.FinishReason == "length" {
					hit = true
					break
				}
			}
		case kindTermination:
			hit = f.set[t.TerminationReason]
		}
		if hit {
			if r != "" {
				r += ","
			}
			if f.kind == kindTermination {
				r += "termination=" + t.TerminationReason
			} else {
				r += f.Name
			}
		}
	}
	return r
}
