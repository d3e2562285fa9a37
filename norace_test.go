//go:build !race

package epochsketch_test

const raceEnabled = false
