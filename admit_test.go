package epochsketch_test

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/internal/admit"
)

// TestAdmitWithinLimit: the conditional add adds while the decayed count
// plus the weight stays within the limit, refuses without writing once it
// would not, and admits again as the count decays; on every layout.
func TestAdmitWithinLimit(t *testing.T) {
	for _, two := range []bool{false, true} {
		t.Run(fmt.Sprintf("twochoice=%v", two), func(t *testing.T) {
			sk, clk := newManual(t, epochsketch.Config{NumBuckets: 64, TwoChoice: two})
			const limit = 10
			for i := 1; i <= 5; i++ {
				if est, ok := sk.Admit(time.Time{}, "k", 2, limit); !ok || est != uint32(2*i) {
					t.Fatalf("add %d: (%d, %v), want (%d, true)", i, est, ok, 2*i)
				}
			}
			b, j := slotOf(sk, "k")
			before := sk.Word(b, j)
			if est, ok := sk.Admit(time.Time{}, "k", 1, limit); ok || est != limit {
				t.Fatalf("at the limit: (%d, %v), want (%d, false)", est, ok, limit)
			}
			if w := sk.Word(b, j); w != before {
				t.Fatalf("a refusal wrote the slot: %#x, was %#x", w, before)
			}
			if est, ok := sk.Admit(time.Time{}, "k", limit+1, limit); ok || est != limit {
				t.Fatalf("a weight above the limit: (%d, %v), want (%d, false)", est, ok, limit)
			}
			clk.Advance(time.Second) // 10 halves to 5: room for 5
			if est, ok := sk.Admit(time.Time{}, "k", 5, limit); !ok || est != limit {
				t.Fatalf("a tick later: (%d, %v), want (%d, true)", est, ok, limit)
			}
			if est, ok := sk.Admit(time.Time{}, "k", 1, limit); ok || est != limit {
				t.Fatalf("full again: (%d, %v), want (%d, false)", est, ok, limit)
			}
			// A stale sibling to scrub sends the add down the slow path; the
			// limit still holds there.
			clk.Advance(30 * time.Second)
			if est, ok := sk.Admit(time.Time{}, "k", limit, limit); !ok || est != limit {
				t.Fatalf("after 30 silent ticks: (%d, %v), want (%d, true)", est, ok, limit)
			}
			if est, ok := sk.Admit(time.Time{}, "k", 1, limit); ok || est != limit {
				t.Fatalf("full after the scrub: (%d, %v), want (%d, false)", est, ok, limit)
			}
		})
	}
}

// TestAdmitRacing: goroutines racing on one key at one instant never admit
// more than the limit together, and the count holds exactly what they
// admitted. Run under -race.
func TestAdmitRacing(t *testing.T) {
	for _, two := range []bool{false, true} {
		t.Run(fmt.Sprintf("twochoice=%v", two), func(t *testing.T) {
			sk, _ := newManual(t, epochsketch.Config{NumBuckets: 16, TwoChoice: two})
			const limit, goroutines, calls = 500, 8, 250
			var admitted atomic.Uint32
			parallel(goroutines, func(int) {
				for range calls {
					if _, ok := sk.Admit(time.Time{}, "hot", 1, limit); ok {
						admitted.Add(1)
					}
				}
			})
			// 2000 calls for 500 places: a refusal over the limit means the
			// count was at the limit, and it never falls within a tick.
			if n := admitted.Load(); n != limit {
				t.Fatalf("admitted %d, want exactly the limit %d (%d updates dropped)", n, limit, sk.Stats().CASRetriesExhausted)
			}
			if est := sk.Estimate("hot"); est != limit {
				t.Fatalf("estimate %d, want the %d admitted", est, limit)
			}
		})
	}
}

// TestAdmitBoundBeforeReadFrom: package limit binds the conditional add once,
// when it creates its sketch; a snapshot read into that sketch afterwards
// brings its own SipHash key (a Seed 0 sketch adopts it), and the bound
// function must hash with that key, or it would miss every restored count.
func TestAdmitBoundBeforeReadFrom(t *testing.T) {
	cfg := epochsketch.Config{NumBuckets: 64, Hash: epochsketch.HashSipHash13, Clock: epochsketch.NewManualClock(t0)}
	src := epochsketch.New(cfg)
	src.ObserveN(time.Time{}, "client", 8)
	var snap bytes.Buffer
	if _, err := src.WriteTo(&snap); err != nil {
		t.Fatal(err)
	}
	dst := epochsketch.New(cfg)
	add, addBytes := admit.Bind(dst)
	if _, err := dst.ReadFrom(&snap); err != nil {
		t.Fatal(err)
	}
	if r, ok := add(time.Time{}, "client", 1, 100); !ok || r.Est != 9 {
		est := r.Est
		t.Errorf("after ReadFrom: (%d, %v), want (9, true): the bound function kept the old key", est, ok)
	}
	if r, ok, _ := addBytes(time.Time{}, []byte("client"), 1, 100); !ok || r.Est != 10 {
		est := r.Est
		t.Errorf("bytes form after ReadFrom: (%d, %v), want (10, true)", est, ok)
	}
}

// TestAdmitExhaustedRefuses: a conditional add whose compare-and-swaps were
// all lost refuses, writing nothing, and is counted as Contended for
// package limit's Stats (and in CASRetriesExhausted), where Observe's is
// only dropped.
func TestAdmitExhaustedRefuses(t *testing.T) {
	sk, _ := newManual(t, epochsketch.Config{NumBuckets: 4})
	sk.Admit(time.Time{}, "k", 2, 10)
	if est, ok := sk.AdmitExhausted("k", 2, 10); ok || est != 1 {
		t.Fatalf("(%d, %v), want (1, false): a refusal, with the estimate read (none: observe1 read nothing)", est, ok)
	}
	if c, s := admit.CountsOf(sk), sk.Stats(); c.Contended != 1 || s.CASRetriesExhausted != 1 {
		t.Fatalf("Contended %d, CASRetriesExhausted %d, want 1 and 1", c.Contended, s.CASRetriesExhausted)
	}
	if est := sk.Estimate("k"); est != 2 {
		t.Fatalf("the key reads %d, want the 2 admitted before", est)
	}
}

// TestAdmitOverflowCounts: a new key meeting a bucket full of keys at
// their limit (400 trials, each on a freshly filled bucket) is admitted by
// admit.Admit (untracked: it chips, as a key of one request cannot evict
// one of ten), refused by admit.Refuse, refused about three times in four
// by admit.Share; each outcome is counted, and every refusal is marked
// Pressure. Observe's path ignores the policy.
func TestAdmitOverflowCounts(t *testing.T) {
	const limit, trials = 20, 400
	for _, o := range []admit.Overflow{admit.Admit, admit.Refuse, admit.Share} {
		var admitted, refused uint32
		var c admit.Counts
		for trial := range trials {
			sk, _ := newManual(t, epochsketch.Config{NumBuckets: 1, Seed: uint64(trial + 1)})
			admit.SetOverflow(sk, o)
			for i := range epochsketch.SlotsPerBucket {
				if _, ok := sk.Admit(time.Time{}, fmt.Sprint("full-", i), limit, limit); !ok {
					t.Fatalf("key %d refused", i)
				}
			}
			est, ok := sk.Admit(time.Time{}, "new", 2, limit)
			switch {
			case ok:
				admitted++
			case est != limit|admit.Pressure:
				t.Fatalf("%v: a new key refused with %#x, want the weakest key's count %d marked Pressure", o, est, limit)
			default:
				refused++
			}
			n := admit.CountsOf(sk)
			c.Untracked += n.Untracked
			c.Evictions += n.Evictions
			c.ChippedAtLimit += n.ChippedAtLimit
			c.RefusedNew += n.RefusedNew
			if o == admit.Refuse {
				if est, _ := sk.Observe("observed"); est != 1 || sk.Stats().ChallengesLost == 0 {
					t.Fatalf("Observe in the full bucket: %d, %+v: want the lottery, lost", est, sk.Stats())
				}
			}
		}
		t.Logf("%v: %d of %d new keys admitted; %+v", o, admitted, trials, c)
		if uint64(refused) != c.RefusedNew || uint64(admitted) != c.Untracked || c.Evictions != 0 {
			t.Errorf("%v: %d admitted, %d refused; counts %+v", o, admitted, refused, c)
		}
		switch o {
		case admit.Admit:
			if admitted != trials || c.ChippedAtLimit == 0 {
				t.Errorf("Admit: %d admitted, %d chips of keys at their limit; want all, and some", admitted, c.ChippedAtLimit)
			}
		case admit.Refuse:
			if refused != trials || c.ChippedAtLimit != 0 {
				t.Errorf("Refuse: %d refused, %d chips of keys at their limit; want all, and none", refused, c.ChippedAtLimit)
			}
		case admit.Share:
			if refused < 270 || refused > 330 || c.ChippedAtLimit == 0 || c.ChippedAtLimit > uint64(admitted) {
				t.Errorf("Share: %d of %d refused, %d chips; want about three in four, and chips only by the rest", refused, trials, c.ChippedAtLimit)
			}
		}
	}
}

// TestForget: package limit's Reset clears every slot of the key's tag, a
// duplicate left by racing claims included, and no other key's.
func TestForget(t *testing.T) {
	sk, _ := newManual(t, epochsketch.Config{NumBuckets: 1})
	sk.Admit(time.Time{}, "k", 6, 10)
	sk.Admit(time.Time{}, "other", 4, 10)
	b, j := slotOf(sk, "k")
	dup := (j + 1) % epochsketch.SlotsPerBucket
	if sk.Word(b, dup) != 0 {
		dup = (j + 2) % epochsketch.SlotsPerBucket
	}
	sk.SetWord(b, dup, sk.Word(b, j)) // a duplicate, as racing claims across a tick leave
	admit.Forget(sk, "k")
	if est := sk.Estimate("k"); est != 0 || sk.Word(b, j) != 0 || sk.Word(b, dup) != 0 {
		t.Fatalf("after Forget the key reads %d, slots %#x and %#x", est, sk.Word(b, j), sk.Word(b, dup))
	}
	if est := sk.Estimate("other"); est != 4 {
		t.Fatalf("another key reads %d after Forget, want 4", est)
	}
	if est, ok := sk.Admit(time.Time{}, "k", 10, 10); !ok || est != 10 {
		t.Fatalf("after Forget: (%d, %v), want the whole limit", est, ok)
	}
}

// ObserveNWithin is the conditional add for other modules (SketchProxy's
// engine): it admits up to the limit, refuses past it writing nothing,
// reports the first sighting, and racing callers never pass the limit.
func TestObserveNWithin(t *testing.T) {
	clk := epochsketch.NewManualClock(time.Unix(1_700_000_000, 0))
	sk := epochsketch.New(epochsketch.Config{NumBuckets: 64, Clock: clk, Seed: 1})
	defer sk.Close()
	est, first, added := sk.ObserveNWithin(time.Time{}, "k", 4, 10)
	if est != 4 || !first || !added {
		t.Fatalf("first add: (%d, %v, %v), want (4, true, true)", est, first, added)
	}
	if est, first, added = sk.ObserveBytesNWithin(time.Time{}, []byte("k"), 6, 10); est != 10 || first || !added {
		t.Fatalf("to the limit: (%d, %v, %v), want (10, false, true)", est, first, added)
	}
	if est, _, added = sk.ObserveNWithin(time.Time{}, "k", 1, 10); est != 10 || added {
		t.Fatalf("past the limit: (%d, %v), want (10, false): refused, nothing written", est, added)
	}
	if est, _, added = sk.ObserveNWithin(time.Time{}, "k", 0, 10); est != 10 || !added {
		t.Fatalf("n == 0: (%d, %v), want the estimate and true", est, added)
	}
	if got := sk.Estimate("k"); got != 10 {
		t.Fatalf("estimate %d after a refusal, want 10", got)
	}
	var admitted atomic.Uint32
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				if _, _, ok := sk.ObserveNWithin(time.Time{}, "race", 1, 100); ok {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if admitted.Load() != 100 {
		t.Errorf("8 goroutines racing to a limit of 100 added %d", admitted.Load())
	}
}
