package epochsketch_test

import "time"

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
