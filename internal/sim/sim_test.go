package sim

import (
	"bytes"
	"strings"
	"testing"
)

// TestSectionsQuick runs every THEORY.md experiment on CI's reduced grid, so
// the harness never rots; the full grid is `epochsketch sim`.
func TestSectionsQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("the quick grid takes seconds; -short skips it")
	}
	for _, s := range Sections {
		t.Run(s.ID, func(t *testing.T) {
			var b bytes.Buffer
			if err := s.Run(Options{Quick: true, Out: t.TempDir()}, &b); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(b.String(), "|") {
				t.Fatalf("section %s wrote no table:\n%s", s.ID, b.String())
			}
			t.Log("\n" + b.String())
		})
	}
}
