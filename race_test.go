//go:build race

package epochsketch_test

const raceEnabled = true
