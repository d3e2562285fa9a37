package epochsketch_test

import "time"

// t0 is a fixed wall-clock instant for deterministic tests.
var t0 = time.Unix(1_800_000_000, 0).UTC()
