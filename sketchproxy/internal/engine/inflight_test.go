package engine

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/epochsketch/epochsketch/rate"
)

// holdOne decides one request of key from client (cap clientCap, 0 for
// none) under the first rule of s and keeps it in progress: its Decision
// is returned for Done, with a Scratch of its own (a Reset would drop the
// places it holds).
func holdOne(e *Engine, s *Set, client string, clientCap int, key string) Decision {
	facts := [1]Fact{{Rule: s.Rules[0], Key: key}}
	return e.Decide(context.Background(), s, e.Now(), &Request{Facts: facts[:], Client: client, ClientCap: clientCap}, new(Scratch))
}

// Keys a client invents cannot fill the in-flight counts: 8,192 invented
// keys (and, for the per-client cap, client addresses) each holding 2
// places of a cap of 2 leave every fresh key its places, while a held key
// asking for a third is still refused. The count-min table of 2 × 4,096
// cells the counts were kept in had every cell at 4 on average after such
// a flood, so that fresh keys were refused in_flight 3 times in 4 (issue
// 46).
func TestInFlightInventedKeysCannotFill(t *testing.T) {
	const invented, held, fresh = 8192, 2, 1000
	for _, perClient := range []bool{false, true} {
		t.Run("perClient="+strconv.FormatBool(perClient), func(t *testing.T) {
			rs := RuleSpec{Name: "api", Limits: []LimitSpec{{Name: "s", Rate: rate.Rate{Requests: 1e6, Per: time.Second}}}}
			if !perClient {
				rs.MaxInFlight = held
			}
			e, s, _ := compile(t, rs)
			// request is one request of name: as a key under the rule's
			// max_in_flight, or as a client address under a cap of held.
			request := func(name string) Decision {
				if perClient {
					return holdOne(e, s, name, held, "one key")
				}
				return holdOne(e, s, "", 0, name)
			}
			var holding []Decision
			for k := range invented {
				for range held {
					if d := request("invented-" + strconv.Itoa(k)); d.Admitted {
						holding = append(holding, d)
					}
				}
			}
			if n := len(holding); n != invented*held {
				t.Errorf("%d invented keys asking %d times each: %d admitted, want all", invented, held, n)
			}
			refused := 0
			for k := range fresh {
				d := request("fresh-" + strconv.Itoa(k))
				if !d.Admitted {
					refused++
				}
				d.Done()
			}
			if refused > 0 {
				t.Errorf("%d invented keys holding %d each: %d of %d fresh keys asking once refused, want 0", invented, held, refused, fresh)
			}
			if d := request("invented-17"); d.Admitted || d.Worst.Out != InFlight {
				t.Errorf("a key holding its cap of %d asked for one more: admitted %v (%v), want refused in_flight", held, d.Admitted, d.Worst.Out)
			}
			for i := range holding {
				holding[i].Done()
			}
			if d := request("invented-17"); !d.Admitted {
				t.Errorf("once its requests ended, a key was refused (%v)", d.Worst.Out)
			} else {
				d.Done()
			}
		})
	}
}

// Deciding a request of a rule with max_in_flight, under the per-client
// cap, allocates nothing once the Scratch is warm: taking and giving back
// the places is map work on entries that come and go.
func TestDecideInFlightAllocates0(t *testing.T) {
	e, s, _ := compile(t, RuleSpec{Name: "api", MaxInFlight: 4,
		Limits: []LimitSpec{{Name: "s", Rate: rate.Rate{Requests: 1e6, Per: time.Second}}}})
	var sc Scratch
	decideHeld(e, s, "192.0.2.1", &sc)
	if n := testing.AllocsPerRun(1000, func() { decideHeld(e, s, "192.0.2.1", &sc) }); n != 0 {
		t.Errorf("a decision allocated %.1f times, want 0", n)
	}
}

// decideHeld is decide from client 198.51.100.0/24 under a per-client cap
// of 64.
func decideHeld(e *Engine, s *Set, key string, sc *Scratch) bool {
	sc.Reset()
	facts := [1]Fact{{Rule: s.Rules[0], Key: key}}
	d := e.Decide(context.Background(), s, e.Now(), &Request{Facts: facts[:], Client: "198.51.100.0/24", ClientCap: 64}, sc)
	d.Done()
	return d.Admitted
}

// BenchmarkDecideInFlight is BenchmarkDecide for a rule with max_in_flight
// under the per-client cap: each request takes the client's place and the
// key's, and gives both back.
func BenchmarkDecideInFlight(b *testing.B) {
	e, s, clk := compile(b, RuleSpec{Name: "api", MaxInFlight: 4,
		Limits: []LimitSpec{{Name: "s", Rate: rate.Rate{Requests: 4e6, Per: time.Second}}}})
	var sc Scratch
	decideHeld(e, s, "192.0.2.1", &sc)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if !decideHeld(e, s, "192.0.2.1", &sc) {
			b.Fatal("refused")
		}
		if i%1000 == 999 {
			clk.Advance(time.Millisecond)
		}
	}
}

// A Tally's shard fills whole cache lines.
func TestTallyShardSize(t *testing.T) {
	if n := unsafe.Sizeof(tallyShard{}); n%cacheLine != 0 {
		t.Errorf("a tallyShard is %d bytes, not a multiple of %d", n, cacheLine)
	}
}

// A Tally holds the keys in use and a few idle ones: after 100,000 keys
// (short and 5,000 bytes long) each took a place and gave it back, at most
// idleKeys a shard are left, none of them long.
func TestTallyForgetsIdleKeys(t *testing.T) {
	tl := NewTally()
	long := strings.Repeat("x", 5000)
	for i := range 100_000 {
		k := strconv.Itoa(i)
		if i%10 == 0 {
			k += long
		}
		if !tl.Acquire("r", k, 1) {
			t.Fatalf("key %d refused its first place", i)
		}
		if tl.Acquire("r", k, 1) {
			t.Fatalf("key %d given a second place under a cap of 1", i)
		}
		tl.Add("r", k, -1)
	}
	if n := tl.InUse(); n != 0 {
		t.Errorf("%d keys in use, want 0", n)
	}
	kept := 0
	for i := range tl.shards {
		for k := range tl.shards[i].m {
			kept++
			if len(k.key) > MaxKey {
				t.Errorf("an idle key of %d bytes kept", len(k.key))
			}
		}
	}
	if kept > tallyShards*idleKeys {
		t.Errorf("%d idle keys kept, want at most %d", kept, tallyShards*idleKeys)
	}
}

// Goroutines racing for 3 places of one key never hold more than 3 at
// once, and give back all they took. Run under -race.
func TestTallyRacersNeverPassTheCap(t *testing.T) {
	tl := NewTally()
	var holding, most atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				key := "hot"
				if i%2 == 1 {
					key = "cold-" + strconv.Itoa(g) // shares the shards
				}
				if !tl.Acquire("r", key, 3) {
					continue
				}
				if key == "hot" {
					n := holding.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					holding.Add(-1)
				}
				tl.Add("r", key, -1)
			}
		}()
	}
	wg.Wait()
	if m := most.Load(); m > 3 {
		t.Errorf("%d racers held a key's place at once under a cap of 3", m)
	}
	if n := tl.InUse(); n != 0 {
		t.Errorf("%d keys still in use after every place was given back", n)
	}
}
