package sim

import "math"

// Oracle is the exact decayed count of every key with the sketch's own
// integer semantics: on arrival c = (c >> min(age, 63)) + 1; a query reads
// c >> age. Error against it measures the structure (collisions, eviction,
// chipping), not rounding. Its memory grows with the keys: it is the truth,
// not a competitor.
type Oracle struct {
	m map[string]*oentry
}

type oentry struct {
	c    uint64
	tick int64
	real float64 // real-valued exponential decay, for the rounding comparison
	rt   int64
}

// NewOracle returns an empty oracle.
func NewOracle() *Oracle { return &Oracle{m: map[string]*oentry{}} }

func shr(c uint64, age int64) uint64 {
	if age >= 64 {
		return 0
	}
	return c >> age
}

// Observe records key at tick and returns its exact count after the arrival.
func (o *Oracle) Observe(key string, tick int64) uint64 {
	e := o.m[key]
	if e == nil {
		e = &oentry{tick: tick, rt: tick}
		o.m[key] = e
	}
	e.c = min(shr(e.c, tick-e.tick)+1, 1<<24-1)
	e.tick = tick
	e.real = e.real*math.Pow(0.5, float64(tick-e.rt)) + 1
	e.rt = tick
	return e.c
}

// At returns key's exact count at tick.
func (o *Oracle) At(key string, tick int64) uint64 {
	if e := o.m[key]; e != nil {
		return shr(e.c, tick-e.tick)
	}
	return 0
}

// Real returns key's real-valued exponentially decayed count at tick.
func (o *Oracle) Real(key string, tick int64) float64 {
	if e := o.m[key]; e != nil {
		return e.real * math.Pow(0.5, float64(tick-e.rt))
	}
	return 0
}

// Keys returns every key seen.
func (o *Oracle) Keys() []string {
	out := make([]string, 0, len(o.m))
	for k := range o.m {
		out = append(out, k)
	}
	return out
}

// Top returns the k keys with the largest exact count at tick, largest
// first (ties by key, for determinism).
func (o *Oracle) Top(k int, tick int64) []KV {
	all := make([]KV, 0, len(o.m))
	for key := range o.m {
		if c := o.At(key, tick); c > 0 {
			all = append(all, KV{key, c})
		}
	}
	SortKV(all)
	return all[:min(k, len(all))]
}
