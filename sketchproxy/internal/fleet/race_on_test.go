//go:build race

package fleet

// raceOn: the race detector drops sync.Pool's items at random, so
// allocation counts mean nothing under it.
const raceOn = true
