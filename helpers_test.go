package epochsketch_test

import (
	"os"
	"testing"
	"time"
)

// t0 is a fixed wall-clock instant for deterministic tests.
var t0 = time.Unix(1_800_000_000, 0).UTC()

// lottery is a test's full-bucket challenge: the library's
// HeavyKeeper-classic, or the retired chip lottery, which only internal/lab
// reaches (THEORY.md section 1).
type lottery string

const (
	heavyKeeper lottery = "heavykeeper"
	chip        lottery = "chip"
)

var lotteries = []lottery{chip, heavyKeeper}

// skipUnderRace skips a test that checks statistics or a process's life,
// not concurrency, when the race detector only slows it several times over:
// make test-core runs the package again without -race (the trace build's
// run), where it runs.
func skipUnderRace(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("not a concurrency test: make test-core runs it without -race (go test -tags epochsketch_trace .)")
	}
}

// startsProcesses skips t in the 386 run when qemu-user emulates it
// (scripts/test386.sh sets EPOCHSKETCH_QEMU on a host whose kernel cannot
// run 32-bit binaries): qemu-user crashes a Go program that forks. Such a
// test checks files, the API or the King James text, not 32-bit
// arithmetic, and the native runs of make test-core run it.
func startsProcesses(t *testing.T) {
	t.Helper()
	if os.Getenv("EPOCHSKETCH_QEMU") != "" {
		t.Skip("starts a process, which qemu-user cannot: the native runs of make test-core run it")
	}
}
