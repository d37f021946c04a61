package main

import (
	"fmt"
	"math"
	"time"
)

// Range checks of numeric flags: a value out of range is a usage error
// naming the flag, never a silent wrap, NaN or clamp.

func intIn(flag string, v, lo, hi int) error {
	if v < lo || v > hi {
		return usageErrorf("--%s: %d is outside [%d, %d]", flag, v, lo, hi)
	}
	return nil
}

func int64In(flag string, v, lo, hi int64) error {
	if v < lo || v > hi {
		return usageErrorf("--%s: %d is outside [%d, %d]", flag, v, lo, hi)
	}
	return nil
}

func floatIn(flag string, v, lo, hi float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < lo || v > hi {
		return usageErrorf("--%s: %v is outside [%v, %v]", flag, v, lo, hi)
	}
	return nil
}

func durationIn(flag string, v, lo, hi time.Duration) error {
	if v < lo || v > hi {
		return usageErrorf("--%s: %s is outside [%s, %s]", flag, v, lo, hi)
	}
	return nil
}

func bytesIn(flag, raw string, lo, hi int64) (int64, error) {
	n, err := parseBytes(raw)
	if err != nil {
		return 0, usageErrorf("--%s: %v", flag, err)
	}
	if n < lo || n > hi {
		return 0, usageErrorf("--%s: %s is outside [%s, %s]", flag, raw, formatBytes(lo), formatBytes(hi))
	}
	return n, nil
}

// firstErr returns the first non-nil error.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// formatBytes writes n in the largest binary unit that divides it.
func formatBytes(n int64) string {
	for _, u := range []struct {
		s string
		m int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.m && n%u.m == 0 {
			return fmt.Sprintf("%d%s", n/u.m, u.s)
		}
	}
	return fmt.Sprintf("%dB", n)
}
