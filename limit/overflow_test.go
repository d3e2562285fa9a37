package limit_test

import (
	"fmt"
	"math/bits"
	"strings"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/limit"
	"github.com/epochsketch/epochsketch/rate"
)

// flood is one run of a client at 3 times its limit (Requests = Burst per
// second) beside perTick new keys in every tick, each sending its Burst at
// once (so at its limit), over 31 s on a ManualClock.
type flood struct {
	overflow         limit.Overflow
	buckets, burst   int
	perTick          int
	seed             uint64
	client, refused  int // the client's admissions after its first second, and its refusals
	floodIn, floodAt int // the flood's admissions and requests
	stats            limit.Stats
}

func (f *flood) run() {
	clk := epochsketch.NewManualClock(t0)
	l := limit.NewWith(limit.Config{Requests: f.burst, Per: time.Second, NumBuckets: f.buckets, Clock: clk, Seed: f.seed, Overflow: f.overflow})
	defer l.Close()
	const steps, secs = 100, 31     // steps a tick
	step := time.Second / 2 / steps // the default Burst's tick, Per/2
	gap := time.Second / time.Duration(3*f.burst)
	next, k := time.Duration(0), 0
	for el, i := time.Duration(0), 0; el < secs*time.Second; el, i = el+step, i+1 {
		for ; next <= el; next += gap {
			switch {
			case !l.Allow("client"):
				f.refused++
			case el >= time.Second:
				f.client++
			}
		}
		// perTick keys over each tick's steps, spread evenly.
		s := i % steps
		for range f.perTick*(s+1)/steps - f.perTick*s/steps {
			key := fmt.Sprintf("flood-%d", k)
			k++
			for range f.burst {
				f.floodAt++
				if l.Allow(key) {
					f.floodIn++
				}
			}
		}
		clk.Advance(step)
	}
	f.stats = l.Stats()
}

func (f *flood) String() string {
	return fmt.Sprintf("%v, Burst %d, %d new keys a tick in %d buckets: client %d in 30 s (limit %d), flood %d of %d; %+v",
		f.overflow, f.burst, f.perTick, f.buckets, f.client, 30*f.burst, f.floodIn, f.floodAt, f.stats)
}

// top is the most a client at 3 times its limit of burst per second may
// be admitted in 30 s: the limit and package rate's Excess, and one more.
func top(burst int) int {
	return int(float64(30*burst)*(1+rate.Excess(uint32(burst)))) + 1
}

// capacity is the new keys reaching their limit in every tick that
// buckets hold, by Config.NumBuckets' rule: BucketsFor(K × bits.Len(2 ×
// Burst)) = buckets.
func capacity(buckets, burst int) int {
	return buckets * 8 / epochsketch.SafetyFactor / bits.Len(uint(2*burst))
}

// TestOverflowCapacity: at the capacity Config.NumBuckets documents, a
// client at 3 times its limit beside a flood of new keys reaching theirs
// is held to its limit, and at most 0.1% of the flood's keys take counts
// from a key at its limit; at 16 times the capacity, with OverflowAdmit,
// the client is admitted past its limit and Stats shows why.
func TestOverflowCapacity(t *testing.T) {
	const buckets = 64
	for _, burst := range []int{1, 2, 10} {
		for seed := range uint64(4) {
			f := flood{buckets: buckets, burst: burst, perTick: capacity(buckets, burst), seed: seed + 1}
			f.run()
			t.Log(&f)
			if f.refused == 0 {
				t.Fatalf("the client was never refused: %v", &f)
			}
			if f.client < 30*burst-1 || f.client > top(burst) {
				t.Errorf("at capacity the client was admitted %d times in 30 s, want its limit %d (to %d): %v", f.client, 30*burst, top(burst), &f)
			}
			if lost, keys := f.stats.ChippedAtLimit+f.stats.EvictedAtLimit, uint64(f.floodAt/burst); lost*1000 > keys {
				t.Errorf("at capacity %d of %d new keys took counts from keys at their limit, want at most 0.1%%: %v", lost, keys, &f)
			}
		}
	}
	f := flood{buckets: buckets, burst: 1, perTick: 16 * capacity(buckets, 1), seed: 1}
	f.run()
	t.Log(&f)
	if f.refused == 0 || f.client <= top(1) || f.stats.EvictedAtLimit == 0 || f.stats.AdmittedUntracked == 0 {
		t.Fatalf("at 16 times the capacity, OverflowAdmit: want the client past its limit, with evictions at the limit and untracked admissions in Stats: %v", &f)
	}
}

// TestOverflowRefuse: at 16 times the capacity, OverflowRefuse holds the
// client to its limit: no key at its limit loses a count to a new key, and
// the new keys that would have taken them are refused.
func TestOverflowRefuse(t *testing.T) {
	for _, burst := range []int{1, 2, 10} {
		f := flood{overflow: limit.OverflowRefuse, buckets: 64, burst: burst, perTick: 16 * capacity(64, burst), seed: 1}
		f.run()
		t.Log(&f)
		// A Burst of 1 loses a request or two: between its count
		// falling to 1 and its next request, its key is not at its
		// limit, so a new key may take its slot, and it is then a new
		// key in a full bucket.
		if f.refused == 0 || f.client < 30*burst-2 || f.client > top(burst) {
			t.Errorf("the client was admitted %d times in 30 s, want its limit %d (%d to %d), and refused some: %v", f.client, 30*burst, 30*burst-2, top(burst), &f)
		}
		if f.stats.ChippedAtLimit != 0 || f.stats.EvictedAtLimit != 0 || f.stats.RefusedNew == 0 {
			t.Errorf("want no counts taken from keys at their limit and new keys refused: %v", &f)
		}
	}
}

// TestOverflowRefuseRetryAfter: a new key refused because its bucket is
// full of keys at their limit is told to retry when the weakest of them
// has decayed below half its threshold, and is admitted then, not before.
func TestOverflowRefuseRetryAfter(t *testing.T) {
	for _, burst := range []int{1, 2, 5} {
		t.Run(fmt.Sprint("burst=", burst), func(t *testing.T) {
			l, clk := newManual(t, limit.Config{Requests: burst, Per: time.Second, NumBuckets: 1, Overflow: limit.OverflowRefuse})
			clk.Advance(100 * time.Millisecond)
			for i := range 8 { // the bucket's 8 slots, each key at its limit
				if !l.AllowN(time.Time{}, fmt.Sprint("full-", i), burst) {
					t.Fatalf("key %d refused its Burst", i)
				}
			}
			d := l.Decide(time.Time{}, "new", 1)
			// Each count of 2 × Burst + 1 must fall below half that (below
			// 1 for a Burst of 1): about a tick, no quota before.
			tick := rate.Rate{Requests: float64(burst), Per: time.Second}
			lim, _ := tick.Compile()
			if d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 || d.RetryAfter > 2*lim.Tick || d.Reset != d.RetryAfter {
				t.Fatalf("a new key in a full bucket: %+v, want a refusal with a wait under two ticks (%v), Reset the same", d, 2*lim.Tick)
			}
			if s := l.Stats(); s.RefusedNew != 1 {
				t.Fatalf("Stats %+v, want RefusedNew 1", s)
			}
			clk.Advance(d.RetryAfter - time.Nanosecond)
			if l.Allow("new") {
				t.Fatalf("admitted before its RetryAfter")
			}
			clk.Advance(time.Nanosecond)
			if !l.Allow("new") {
				t.Fatalf("refused at its RetryAfter: %+v", l.Stats())
			}
		})
	}
}

// TestOverflowShare: at 16 times the capacity, OverflowShare admits more
// of the flood than OverflowRefuse and less than OverflowAdmit, and holds
// the client closer to its limit than OverflowAdmit.
func TestOverflowShare(t *testing.T) {
	var f [3]flood
	for i, o := range []limit.Overflow{limit.OverflowAdmit, limit.OverflowShare, limit.OverflowRefuse} {
		f[i] = flood{overflow: o, buckets: 64, burst: 1, perTick: 16 * capacity(64, 1), seed: 1}
		f[i].run()
		t.Log(&f[i])
	}
	admit, share, refuse := &f[0], &f[1], &f[2]
	// The client's key, between its count falling to 1 and its next
	// request, is not at its limit, and a quarter of the new keys meeting
	// its full bucket draw for its slot: it gets a few more than its
	// limit, far fewer than with OverflowAdmit.
	if share.refused == 0 || share.client > 30*115/100 || share.client >= admit.client {
		t.Errorf("OverflowShare admitted the client %d times in 30 s (OverflowAdmit %d), want at most its limit + 15%%, %d", share.client, admit.client, 30*115/100)
	}
	if !(refuse.floodIn < share.floodIn && share.floodIn < admit.floodIn) || share.stats.RefusedNew == 0 {
		t.Errorf("the flood admitted %d (Refuse), %d (Share), %d (Admit): want Share's between", refuse.floodIn, share.floodIn, admit.floodIn)
	}
}

// TestOverflowValidate: an Overflow outside the constants is an error
// that names the field.
func TestOverflowValidate(t *testing.T) {
	err := limit.Config{Requests: 1, Per: time.Second, Overflow: 3}.Validate()
	if err == nil || !strings.Contains(err.Error(), "Config.Overflow is Overflow(3): want OverflowAdmit") {
		t.Fatalf("Overflow 3: %v", err)
	}
	if s := limit.OverflowShare.String(); s != "OverflowShare" {
		t.Errorf("String: %q", s)
	}
}

// TestOverflowRefuseNewClient: OverflowRefuse fails closed for new keys
// only in buckets full of keys at their limit. A client that arrives
// during a flood of 16 times the capacity, at 3 times its limit of 10 per
// second, meets buckets holding keys below their limit too: it challenges
// them, and its losses are admitted untracked (Stats.AdmittedUntracked),
// so that it passes its limit a little (Config's OverflowRefuse gives the
// numbers this logs), but by no more than 5%.
func TestOverflowRefuseNewClient(t *testing.T) {
	const burst, buckets = 10, 64
	clk := epochsketch.NewManualClock(t0)
	l := limit.NewWith(limit.Config{Requests: burst, Per: time.Second, NumBuckets: buckets, Clock: clk, Seed: 1, Overflow: limit.OverflowRefuse})
	defer l.Close()
	perTick := 16 * capacity(buckets, burst)
	const steps = 100
	step := time.Second / 2 / steps
	gap := time.Second / (3 * burst)
	next, k := time.Second, 0
	admitted, untracked, lastUntracked := 0, 0, time.Duration(0)
	for el, i := time.Duration(0), 0; el < 31*time.Second; el, i = el+step, i+1 {
		for ; next <= el; next += gap {
			before := l.Stats().AdmittedUntracked
			if l.Allow("late") {
				admitted++
				if l.Stats().AdmittedUntracked != before {
					untracked++
					lastUntracked = el - time.Second
				}
			}
		}
		s := i % steps
		for range perTick*(s+1)/steps - perTick*s/steps {
			key := fmt.Sprintf("flood-%d", k)
			k++
			for range burst {
				l.Allow(key)
			}
		}
		clk.Advance(step)
	}
	limitIn30s := burst + 30*burst // its first burst, then 10 a second
	t.Logf("the late client: %d admitted in 30 s (its limit %d), %d of them untracked, the last %v after its first request; %+v", admitted, limitIn30s, untracked, lastUntracked, l.Stats())
	if untracked == 0 || admitted*100 > limitIn30s*105 {
		t.Fatalf("the late client was admitted %d times, %d untracked: want some untracked, and at most 5%% over its limit %d", admitted, untracked, limitIn30s)
	}
}
