package fleet

import (
	"fmt"
	"github.com/epochsketch/epochsketch"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// peersOf builds n peers with the demands ds and stored guarantees gs.
func peersOf(ds, gs []uint32) []peerShare {
	ps := make([]peerShare, len(ds))
	for i := range ds {
		ps[i] = peerShare{id: fmt.Sprint("r", i), d: ds[i]}
		if gs != nil {
			ps[i].g = gs[i]
		}
	}
	return ps
}

// guarantees is every peer's guarantee, each computed as that replica
// would, from the same records.
func guarantees(ps []peerShare, n int, young bool, theta, point uint32) []uint32 {
	gs := make([]uint32, len(ps))
	for i, p := range ps {
		gs[i], _, _ = guarantee(p.id, ps, n, young, theta, point, "k")
	}
	return gs
}

// The guarantees never add up to more than θ, whatever the demands, the
// stored guarantees and the young key's reserve; on a steady round robin
// they add up to θ exactly (the limit is admitted), in whole requests.
func TestGuaranteesAddUpToTheLimit(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		n := 1 + rng.IntN(6)
		present := 1 + rng.IntN(n)
		theta := 2 * uint32(1+rng.IntN(200))
		ds := make([]uint32, present)
		gs := make([]uint32, present)
		for i := range ds {
			ds[i] = uint32(rng.IntN(1000))
			gs[i] = 2 * uint32(rng.IntN(int(theta)/2/present+1))
		}
		young := rng.IntN(2) == 0
		point := sharePoint(theta, int64(n), 0.5)
		ps := peersOf(ds, gs)
		var sum, reserve uint32
		for i, p := range ps {
			g, r, _ := guarantee(p.id, ps, n, young, theta, point, "k")
			if g%shareUnit != 0 {
				t.Fatalf("guarantee %d: not whole requests", g)
			}
			// Each is computed against the others' stored guarantees.
			others := uint32(0)
			for j := range gs {
				if j != i {
					others += gs[j]
				}
			}
			if g+others+r > theta && g > 0 {
				t.Fatalf("θ %d: %d with the others' %d and reserve %d pass θ", theta, g, others, r)
			}
			sum, reserve = sum+g, r
		}
		_ = sum
		_ = reserve
	}
	// Steady round robin: equal demands that fill, guarantees stored.
	for _, c := range []struct {
		theta uint32
		n     int
	}{{20, 3}, {80, 3}, {100, 5}, {2000, 3}, {24, 5}, {4, 2}} {
		d := 3 * c.theta / uint32(c.n) // 3x the limit
		ps := peersOf(make([]uint32, c.n), nil)
		for i := range ps {
			ps[i].d = d
		}
		gs := guarantees(ps, c.n, false, c.theta, 0)
		for i := range ps {
			ps[i].g = gs[i]
		}
		gs = guarantees(ps, c.n, false, c.theta, 0)
		var sum uint32
		for _, g := range gs {
			sum += g
		}
		if sum != c.theta {
			t.Errorf("θ %d over %d replicas at 3x: guarantees %v add up to %d", c.theta, c.n, gs, sum)
		}
	}
}

// A remainder request stays with the replica that holds it while the
// demands only jitter (a holder loses it to a claim larger by half a
// request): shares that moved at every round would leave it unused.
func TestGuaranteeRemainderStays(t *testing.T) {
	const theta, n = 20, 3 // 10 requests over 3: one holds 4
	ps := peersOf([]uint32{40, 40, 40}, nil)
	gs := guarantees(ps, n, false, theta, 0)
	for i := range ps {
		ps[i].g = gs[i]
	}
	holder := -1
	for i, g := range gs {
		if g == 8 {
			holder = i
		}
	}
	if holder < 0 {
		t.Fatalf("guarantees %v: no replica holds the remainder", gs)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 200 {
		for i := range ps {
			ps[i].d = uint32(38 + rng.IntN(5)) // ±5%
		}
		g, _, _ := guarantee(ps[holder].id, ps, n, false, theta, 0, "k")
		if g != 8 {
			t.Fatalf("demands %v: the holder's guarantee moved to %d", ps, g)
		}
	}
}

// A guarantee is given only where the replica's requests fill it: a
// replica that sees a request every other tick holds none (its share stays
// in the pool, for whichever replica has a request), and a one-request
// guarantee needs two requests a tick.
func TestGuaranteeOnlyWhereFilled(t *testing.T) {
	for _, c := range []struct {
		theta uint32
		n     int
		d     uint32
		want  uint32
	}{
		{2, 5, 2, 0},      // 1 a second over 5 replicas at 2x: pool
		{2, 2, 10, 0},     // 1 a second over 2 at 10x: θ/N holds no whole request, so none (pool)
		{4, 2, 10, 2},     // 2 a second over 2 at 10x: 2.5 requests a tick fill one
		{2, 5, 4, 0},      // 1 a tick is not enough for a one-request guarantee
		{20, 3, 8, 6},     // 10 a second over 3 at 1.2x: 3 requests each, the remainder pooled
		{20, 3, 14, 8},    // at 2x: the remainder too (4 requests need 8.8 counts of demand)
		{80, 3, 0, 0},     // no demand yet
		{2000, 3, 70, 62}, // a demand of 70 fills 31 requests
	} {
		ps := peersOf(make([]uint32, c.n), nil)
		for i := range ps {
			ps[i].d = c.d
		}
		gs := guarantees(ps, c.n, false, c.theta, 0)
		var max uint32
		for _, g := range gs {
			max = uint32(maxU(uint64(max), uint64(g)))
		}
		if max != c.want {
			t.Errorf("θ %d over %d, demand %d each: guarantees %v, want the largest %d", c.theta, c.n, c.d, gs, c.want)
		}
	}
}

func maxU(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}

// On a key's first rounds, replicas not yet present count at the average
// demand and hold the promotion point in reserve: the first replica to
// share a round-robin key takes its third, not the whole limit.
func TestGuaranteeYoungKeyHoldsRoomForTheOthers(t *testing.T) {
	ps := peersOf([]uint32{60}, nil)
	g, reserve, split := guarantee("r0", ps, 3, true, 60, 10, "k")
	if g != 20 || reserve != 20 || split != 3 {
		t.Errorf("young, alone of 3: guarantee %d, reserve %d, split %d; want 20, 20, 3", g, reserve, split)
	}
	g, reserve, _ = guarantee("r0", ps, 3, false, 60, 10, "k")
	if g != 54 || reserve != 0 {
		t.Errorf("after its first rounds, alone of 3 (a sticky balancer): guarantee %d, reserve %d; want 54 (its demand fills 27 requests), 0", g, reserve)
	}
}

// A young key's reserve is held for the replicas not yet present, never
// for the replica that reckons it: a view of a claim heard just after the
// records were flushed names only the replicas that wrote since, not this
// one, which had held a reserve for itself and refused its own room.
func TestGuaranteeReserveNotForMe(t *testing.T) {
	ps := peersOf([]uint32{20, 20, 20}, nil) // r0, r1, r2
	_, reserve, split := guarantee("r0", ps, 3, true, 60, 10, "k")
	if reserve != 0 || split != 3 {
		t.Errorf("all 3 in the records: reserve %d, split %d; want 0, 3", reserve, split)
	}
	_, reserve, _ = guarantee("r0", ps[1:], 3, true, 60, 10, "k")
	if reserve != 0 {
		t.Errorf("r0 absent from the records of the 2 others: reserve %d, want 0 (every replica present)", reserve)
	}
	_, reserve, _ = guarantee("r0", ps[2:], 3, true, 60, 10, "k")
	if reserve != 10 {
		t.Errorf("r0 absent from the records of 1 other: reserve %d, want 10 (one replica not yet present)", reserve)
	}
}

// Nor is the replica that reckons a young key's view one of its virtual
// replicas (those held at their share of the pool: allowance): a claim
// heard just after a FLUSHALL that names r1 and r2, not r0, leaves r0 the
// room a view that names all three does.
func TestViewVirtualNotMe(t *testing.T) {
	clk := epochsketch.NewManualClock(time.Unix(1_700_000_000, 0))
	f := hostileFleet(t, newMemStore(clk.Now), clk.Now, 3)
	f.up.Store(true)
	e := hostileEntry(f, "k", 40, 0)
	e.since = clk.Now().UnixNano() // promoted here just now: young
	tk := clk.Now().UnixNano() / int64(e.tick)
	us := clk.Now().UnixMicro()
	rec := func(id string, c uint32) signedRec { return signedRec{id: id, c: c, d: 20, at: tk, ts: us} }
	var tops []uint32
	for _, recs := range [][]signedRec{{rec("r1", 10), rec("r2", 10)}, {rec("r0", 0), rec("r1", 10), rec("r2", 10)}} {
		rp := shareReply{ok: true, claim: true, verified: true, tick: tk, born: us, now: us, recs: recs}
		v, _ := f.viewOf(e, &rp, 0, nil)
		top, _ := v.allowance(40, tk)
		if v.virtual != 0 || v.reserve != 0 {
			t.Errorf("%d records of 3 replicas: virtual %d, reserve %d; want 0 and 0 (all present)", len(recs), v.virtual, v.reserve)
		}
		tops = append(tops, top)
	}
	if tops[0] != tops[1] {
		t.Errorf("r0 may reach %d where the records do not name it, %d where they do: want the same", tops[0], tops[1])
	}
}

// allowance: a replica counts to its guarantee quietly (and to what Redis
// holds of its count past it), and to the pool's room only with a claim;
// what others took of the pool and what they hold over their guarantees
// comes off, and halves with the ticks. A quiet share of the pool (4 here)
// was taken again by the others' claims before they saw it.
func TestAllowance(t *testing.T) {
	v := &shareView{tick: 100, g: 6, sumGo: 12, n: 3,
		others: []peerShare{{id: "a", c: 6, g: 6}, {id: "b", c: 4, g: 6}}}
	// θ 30: the guarantees hold 18, the pool 12.
	top, quiet := v.allowance(30, 100)
	if top != 18 || quiet != 6 {
		t.Errorf("pool untouched: top %d quiet %d, want 18 and 6", top, quiet)
	}
	// Redis holds 4 counts of this replica's past its guarantee: quiet.
	v.meC = 10
	if top, quiet = v.allowance(30, 100); top != 18 || quiet != 10 {
		t.Errorf("4 past the guarantee held: top %d quiet %d, want 18 and 10", top, quiet)
	}
	v.meC = 0
	// b took 5 counts past its guarantee (3 requests' worth, rounded up).
	v.others[1].c = 11
	top, quiet = v.allowance(30, 100)
	if top != 12 || quiet != 6 {
		t.Errorf("b over by 5: top %d quiet %d, want 12 and 6", top, quiet)
	}
	// A tick later b's count halved to 5: within its guarantee again.
	top, quiet = v.allowance(30, 101)
	if top != 18 || quiet != 6 {
		t.Errorf("a tick later: top %d quiet %d, want 18 and 6", top, quiet)
	}
	// A share that moved: another replica holds more than its guarantee
	// allows and the pool is gone; this one waits for that count to halve.
	w := &shareView{tick: 5, g: 10, sumGo: 10, n: 2, others: []peerShare{{id: "a", c: 16, g: 10}}}
	if top, _ := w.allowance(20, 5); top != 4 {
		t.Errorf("another holds 16 of 20: top %d, want 4", top)
	}
}

// sharePoint: a key is promoted at half its fair share, and from its first
// request where a fair share holds no whole request.
func TestSharePoint(t *testing.T) {
	for _, c := range []struct {
		theta uint32
		n     int64
		want  uint32
	}{{2, 2, 0}, {2, 5, 0}, {4, 2, 2}, {20, 3, 3}, {80, 3, 13}, {2000, 5, 200}, {8, 5, 0}, {10, 5, 2}} {
		if got := sharePoint(c.theta, c.n, 0.5); got != c.want {
			t.Errorf("θ %d, N %d: promoted past %d, want %d", c.theta, c.n, got, c.want)
		}
	}
}

// A replica never believes another's count fell faster than it halves:
// a record that reads lower than the last view's count halved to now, or
// is missing while that count is not spent, is what that view said of it
// (count, demand halved, guarantee), and the view built on it is suspect;
// a record that reads as much or more, or one whose count halved away,
// is the reply's.
func TestKeepPeers(t *testing.T) {
	prev := &shareView{tick: 10, others: []peerShare{{id: "a", c: 40, d: 40, g: 12}, {id: "b", c: 16, d: 8, g: 6}, {id: "c", c: 1, d: 2, g: 0}}}
	for _, c := range []struct {
		name  string
		tick  int64
		peers []peerShare
		want  string
		kept  bool
	}{
		{"whole", 11, []peerShare{{id: "a", c: 20, d: 40, g: 12}, {id: "b", c: 9, d: 8, g: 6}, {id: "me", c: 5}}, "a:20/40/12 b:9/8/6 me:5/0/0", false},
		{"rewritten", 11, []peerShare{{id: "a", c: 0, d: 0, g: 0}, {id: "b", c: 9, d: 8, g: 6}, {id: "me", c: 5}}, "a:20/40/12 b:9/8/6 me:5/0/0", true},
		{"a tick early", 11, []peerShare{{id: "a", c: 10, d: 40, g: 12}, {id: "b", c: 8, d: 8, g: 6}, {id: "me", c: 5}}, "a:20/40/12 b:8/8/6 me:5/0/0", false},
		{"demand and guarantee rewritten", 11, []peerShare{{id: "a", c: 20, d: 0, g: 0}, {id: "b", c: 9, d: 8, g: 6}, {id: "me", c: 5}}, "a:20/40/12 b:9/8/6 me:5/0/0", true},
		{"flushed", 12, []peerShare{{id: "me", c: 5}}, "me:5/0/0 a:10/20/12 b:4/4/6", true},
		{"later than the reply", 9, []peerShare{{id: "me", c: 5}}, "me:5/0/0", false},
	} {
		got, kept := keepPeers(c.peers, prev, c.tick)
		var b strings.Builder
		for i, p := range got {
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%s:%d/%d/%d", p.id, p.c, p.d, p.g)
		}
		if b.String() != c.want || kept != c.kept {
			t.Errorf("%s: %s (kept %v), want %s (kept %v)", c.name, b.String(), kept, c.want, c.kept)
		}
	}
}
