package config

import (
	"testing"
	"time"
)

func TestParseDuration(t *testing.T) {
	for s, want := range map[string]time.Duration{"1s": time.Second, "1d": 24 * time.Hour, "0.5d": 12 * time.Hour, "90m": 90 * time.Minute} {
		if got, err := parseDuration(s); err != nil || got != want {
			t.Errorf("%s: %v %v", s, got, err)
		}
	}
	for _, s := range []string{"", "d", "-1d", "1w", "1 s"} {
		if _, err := parseDuration(s); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}
