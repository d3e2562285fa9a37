//go:build race

package sketchproxy

// raceScale shrinks the long replays under the race detector, which slows
// them tenfold; their figures come from normal runs.
const raceScale = 8
