// Package kjvtest gives tests the King James text (Debian's bible-kjv), as
// sim.KJVStream reads it.
package kjvtest

import (
	"os"
	"testing"

	"github.com/epochsketch/epochsketch/internal/sim"
)

// Words is the King James text in order. CI installs the package and must
// have it: there a missing text fails the test; elsewhere the test is
// skipped with the reason.
func Words(t testing.TB) []string {
	t.Helper()
	words, err := sim.KJVStream()
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("bible-kjv is missing in CI (.ci/run installs it): %v", err)
		}
		t.Skip(err)
	}
	return words
}
