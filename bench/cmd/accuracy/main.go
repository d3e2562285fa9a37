// Command accuracy measures, for the peers that answer "how often has this
// key occurred", their error against the exact decayed count (the sketch's
// integer semantics: c = (c >> age) + 1 per arrival, 1 s ticks) on one
// stream: Zipf(1.1) over 1M keys, 100,000 arrivals per tick for 40 ticks, with
// the key ranks rotating by 100,000 every 10 ticks so recency matters. Each
// peer's answer is its Observe result at the key's last arrival.
package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/bench"
)

func main() {
	const ticks, perTick, keys = 40, 100_000, 1_000_000
	r := rand.New(rand.NewPCG(1, 7))
	z := rand.NewZipf(r, 1.1, 1, keys-1)
	names := make([]string, keys)
	for i := range names {
		names[i] = "api_client:" + strconv.Itoa(i)
	}
	type entry struct {
		c    uint64
		tick int
	}
	exact := map[string]*entry{}
	t0 := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	clk := epochsketch.NewManualClock(t0)
	es := epochsketch.New(epochsketch.Config{NumBuckets: bench.TableBuckets, Clock: clk})
	var peers []struct {
		name string
		c    bench.Counter
		last map[string]uint32
	}
	what := map[string]string{
		"mutex-map":     "exact count since start",
		"boom-countmin": "Count-Min, no decay",
		"tinylfu-style": "4-bit counters, periodic halving",
	}
	for _, p := range bench.Peers {
		if w, ok := what[p.Name]; ok {
			peers = append(peers, struct {
				name string
				c    bench.Counter
				last map[string]uint32
			}{p.Name + " (" + w + ")", p.New(), map[string]uint32{}})
		}
	}
	esLast := map[string]uint32{}
	for tick := range ticks {
		clk.Set(t0.Add(time.Duration(tick) * time.Second))
		shift := tick / 10 * 100_000
		for range perTick {
			k := names[(int(z.Uint64())+shift)%keys]
			e := exact[k]
			if e == nil {
				e = &entry{tick: tick}
				exact[k] = e
			}
			e.c = e.c>>min(uint(tick-e.tick), 63) + 1
			e.tick = tick
			esLast[k], _ = es.Observe(k)
			for _, p := range peers {
				p.last[k] = p.c.Observe(k)
			}
		}
	}
	// The true top 100 by exact decayed count at the last tick, and each
	// structure's answer at the key's last arrival, decayed to the last tick
	// for EpochSketch (its estimate now), as it would be read.
	type kv struct {
		k string
		c uint64
	}
	var all []kv
	for k, e := range exact {
		all = append(all, kv{k, e.c >> min(uint(ticks-1-e.tick), 63)})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].c > all[j].c || all[i].c == all[j].c && all[i].k < all[j].k })
	top := all[:100]
	fmt.Println("| structure | mean relative error, true top 100 (decayed) | median | max |")
	fmt.Println("|---|--:|--:|--:|")
	report := func(name string, answer func(k string) float64) {
		var errs []float64
		for _, t := range top {
			errs = append(errs, math.Abs(answer(t.k)-float64(t.c))/float64(t.c))
		}
		sort.Float64s(errs)
		sum := 0.0
		for _, e := range errs {
			sum += e
		}
		fmt.Printf("| %s | %.4f | %.4f | %.4f |\n", name, sum/float64(len(errs)), errs[len(errs)/2], errs[len(errs)-1])
	}
	report("epochsketch (Estimate at the last tick)", func(k string) float64 { return float64(es.Estimate(k)) })
	for _, p := range peers {
		report(p.name, func(k string) float64 { return float64(p.last[k]) })
	}
	if len(top) < 100 {
		fmt.Fprintln(os.Stderr, "accuracy: fewer than 100 keys")
		os.Exit(1)
	}
}
