package train

import (
	"math"
	"testing"
)

// TestStaleNeverOverflows: staleness is exact for any group version a shard
// may hold and any policy version, also where policy-version wraps an int64.
func TestStaleNeverOverflows(t *testing.T) {
	for _, c := range []struct {
		name            string
		policy, version int64
		maxStale        int64
		want            bool
	}{
		{"behind by more than the bound", 10, 5, 3, true},
		{"behind by the bound", 10, 7, 3, false},
		{"ahead", 10, 12, 0, false},
		{"very old group", 10, math.MinInt64, 3, true},
		{"huge policy", math.MaxInt64, 5, 3, true},
		{"huge policy, very old group", math.MaxInt64, math.MinInt64, math.MaxInt64, true},
		{"negative policy, newest group", -5, math.MaxInt64, 0, false},
		{"largest bound", MaxPolicyVersion, 0, MaxPolicyVersion, false},
		{"no bound", math.MaxInt64, math.MinInt64, -1, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := &former{cfg: &Config{MaxStaleness: c.maxStale}}
			if got := f.stale(&group{version: c.version}, c.policy); got != c.want {
				t.Errorf("stale(policy %d, group %d, max %d) = %v, want %v", c.policy, c.version, c.maxStale, got, c.want)
			}
		})
	}
}

func TestCheckPolicyVersion(t *testing.T) {
	for v, ok := range map[int64]bool{0: true, 7: true, MaxPolicyVersion: true, -1: false, MaxPolicyVersion + 1: false, math.MinInt64: false, math.MaxInt64: false} {
		if err := CheckPolicyVersion(v); (err == nil) != ok {
			t.Errorf("CheckPolicyVersion(%d) = %v", v, err)
		}
	}
}
