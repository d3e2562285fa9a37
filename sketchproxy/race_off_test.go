//go:build !race

package sketchproxy

const raceScale = 1
