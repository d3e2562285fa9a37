package epochsketch

import (
	"sync/atomic"
	"unsafe"
)

// Stats are the sketch's self-metrics. Every field is a count since
// New, exact, monotonic; take differences for rates. Encoded as JSON, the
// fields are snake_case (cas_retries_exhausted), like the fields around
// them in `epochsketch top -json`.
type Stats struct {
	// CASRetriesExhausted counts calls that lost the compare-and-swap race
	// four times (the first try and 3 retries) and dropped their increment
	// (docs/DESIGN.md, Dropped updates): the key reads one lower than the number of its Observes.
	CASRetriesExhausted uint64 `json:"cas_retries_exhausted"`
	// Evictions counts slots won from a live occupant: a chip that took the
	// occupant's last count, so the challenger claimed the slot.
	Evictions uint64 `json:"evictions"`
	// Chips counts the counts taken from the weakest occupant by lottery
	// wins that did not evict it (one per win; a weighted ObserveN can win
	// several draws).
	Chips uint64 `json:"chips"`
	// ScrubbedZombies counts slots zeroed by scrub-on-write (docs/DESIGN.md): slots
	// silent for 24 ticks or more, cleared before they can wrap.
	ScrubbedZombies uint64 `json:"scrubbed_zombies"`
	// ChallengesLost counts calls whose key stayed untracked in a full bucket
	// (bounced or chipped without a takeover): the bucket overflow pressure.
	// Such calls return (1, true).
	ChallengesLost uint64 `json:"challenges_lost"`
}

const (
	statCAS = iota
	statEvictions
	statChips
	statScrubbed
	statLost
	// The conditional add's own outcomes (admit.go), which package limit
	// reports through internal/admit and Stats leaves out.
	statUntracked      // admitted untracked: the key lost its challenge
	statEvictedAtLimit // evictions whose victim was at the add's limit
	statChippedAtLimit // chips whose victim was at the add's limit
	statRefusedNew     // new keys refused by the overflow policy
	statContended      // refused after 4 lost compare-and-swaps
	numStats
)

// statShards spreads the counters over cache lines by bucket index, so that
// goroutines working on different buckets rarely write the same line.
const statShards = 16

type statShard struct {
	n [numStats]atomic.Uint64
	_ [cacheLine - unsafe.Sizeof([numStats]atomic.Uint64{})%cacheLine]byte
}

type statTable [statShards]statShard

func (t *statTable) add(bucket uint64, which int) {
	t[bucket%statShards].n[which].Add(1)
}

func (t *statTable) addN(bucket uint64, which int, n uint32) {
	t[bucket%statShards].n[which].Add(uint64(n))
}

// sum adds up each counter over the shards.
func (t *statTable) sum() [numStats]uint64 {
	var sum [numStats]uint64
	for i := range t {
		for j := range sum {
			sum[j] += t[i].n[j].Load()
		}
	}
	return sum
}

func (t *statTable) snapshot() Stats {
	sum := t.sum()
	return Stats{
		CASRetriesExhausted: sum[statCAS],
		Evictions:           sum[statEvictions],
		Chips:               sum[statChips],
		ScrubbedZombies:     sum[statScrubbed],
		ChallengesLost:      sum[statLost],
	}
}
