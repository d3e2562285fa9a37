package rls

import (
	stdheap "container/heap" // accuracy_test.go has a heap of its own
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Metrics are the service's own counts, which sketchproxy's collector
// reads at scrape time (sketchproxy_envoy_rls_*); the decisions themselves
// are the engine's counts, as every door's.
type Metrics struct {
	Requests      atomic.Uint64 // ShouldRateLimit calls
	OverLimit     atomic.Uint64 // ...answered OVER_LIMIT
	UnknownDomain atomic.Uint64 // ...for a domain not configured (answered OK)
	Values        Values        // detailed_metric descriptors' calls, per value
}

// maxValueSeries bounds the per-value series of all detailed_metric
// descriptors together, for the life of the process: a value is one
// series of each sketchproxy_envoy_rls_value_* metric. Each descriptor's
// "other" is one more, bounded by the config.
const maxValueSeries = 1000

// Values counts the detailed_metric descriptors' calls per value, for
// at most max values in all, kept as the space-saving algorithm keeps the
// heaviest items of a stream (Metwally, Agrawal and El Abbadi, 2005): a
// value not tracked takes the place of the tracked value with the fewest
// hits, whose counts move to its descriptor's "other". So a value that
// sends more than its share of hits keeps its series whenever it came
// (the first values no longer keep theirs for good), every series is
// bounded, and for each descriptor the values and "other" add up to
// every hit counted. A value's own counts start when it takes its place;
// its rank also holds the evicted value's hits (space-saving's
// overestimate), so that a newcomer is not evicted by the next one before
// it can show its weight.
type Values struct {
	mu    sync.Mutex
	Max   int                      // 0: maxValueSeries (tests lower it to see the bound work)
	byKey map[valueKey]*valueEntry // the tracked values
	order valueHeap                // the same, the least ranked first
	other map[string]*ValueCounts  // by rule: the values not tracked
}

// valueKey is a tracked value: its rule's name and its label.
type valueKey struct{ rule, value string }

// ValueCounts are a value's calls: hits, and those over or near the limit.
type ValueCounts struct{ Hits, Over, Near uint64 }

// valueEntry is a tracked value: its counts since it got its series, its
// rank (hits, with those of the value it replaced), and its place in the
// heap.
type valueEntry struct {
	key    valueKey
	counts ValueCounts
	rank   uint64
	i      int
}

// valueHeap orders the tracked values by rank, least first
// (container/heap).
type valueHeap []*valueEntry

func (h valueHeap) Len() int           { return len(h) }
func (h valueHeap) Less(i, j int) bool { return h[i].rank < h[j].rank }
func (h valueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i]; h[i].i, h[j].i = i, j }
func (h *valueHeap) Push(x any)        { e := x.(*valueEntry); e.i = len(*h); *h = append(*h, e) }
func (h *valueHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// Add counts one call of value under rule: hits, and whether it was over
// or near the limit.
func (r *Values) Add(rule, value string, hits uint64, over, near bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byKey == nil {
		r.byKey, r.other = map[valueKey]*valueEntry{}, map[string]*ValueCounts{}
	}
	k := valueKey{rule, value}
	e := r.byKey[k]
	switch max := r.limit(); {
	case e != nil:
		e.rank += hits
		stdheap.Fix(&r.order, e.i)
	case len(r.order) < max:
		e = &valueEntry{key: k, rank: hits}
		r.byKey[k] = e
		stdheap.Push(&r.order, e)
	default:
		// Space-saving: the least ranked value gives its place, its
		// counts going to its rule's other.
		e = r.order[0]
		o := r.otherOf(e.key.rule)
		o.Hits, o.Over, o.Near = o.Hits+e.counts.Hits, o.Over+e.counts.Over, o.Near+e.counts.Near
		delete(r.byKey, e.key)
		e.key, e.counts, e.rank = k, ValueCounts{}, e.rank+hits
		r.byKey[k] = e
		stdheap.Fix(&r.order, 0)
	}
	e.counts.Hits += hits
	if over {
		e.counts.Over++
	} else if near {
		e.counts.Near++
	}
}

func (r *Values) limit() int {
	if r.Max > 0 {
		return r.Max
	}
	return maxValueSeries
}

// otherOf is rule's other, made if need be. r.mu is held.
func (r *Values) otherOf(rule string) *ValueCounts {
	o := r.other[rule]
	if o == nil {
		o = &ValueCounts{}
		r.other[rule] = o
	}
	return o
}

// Retain drops the series of every rule not in keep: the descriptors a
// reload removed, or whose detailed_metric it turned off, so that reloads
// that rename descriptors add no series for the life of the process.
func (r *Values) Retain(keep map[string]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	kept := r.order[:0]
	for _, e := range r.order {
		if keep[e.key.rule] {
			e.i = len(kept)
			kept = append(kept, e)
		} else {
			delete(r.byKey, e.key)
		}
	}
	clear(r.order[len(kept):])
	r.order = kept
	stdheap.Init(&r.order)
	for rule := range r.other {
		if !keep[rule] {
			delete(r.other, rule)
		}
	}
}

// Each calls f with every series' counts, the tracked values' and each
// rule's other, under the lock.
func (r *Values) Each(f func(rule, value string, c *ValueCounts)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.order {
		f(e.key.rule, e.key.value, &e.counts)
	}
	for rule, o := range r.other {
		f(rule, "other", o)
	}
}

// KeyValues is an Envoy rule's engine key as an operator can write it:
// the values of the descriptor's entries, joined with "|" as an HTTP
// rule's key parts are (a share_threshold entry's is its wildcard value,
// which all its values count under). The engine key writes each value
// with its length ("5:alice"), so that no two descriptors meet; a key not
// of that shape is returned as it is.
func KeyValues(key string) string {
	var b strings.Builder
	for rest := key; rest != ""; {
		n, tail, ok := strings.Cut(rest, ":")
		l, err := strconv.Atoi(n)
		if !ok || err != nil || l < 0 || l > len(tail) {
			return key
		}
		if b.Len() > 0 {
			b.WriteByte('|')
		}
		b.WriteString(tail[:l])
		rest = tail[l:]
	}
	return b.String()
}

// IsRule reports whether a rule is one of Envoy's descriptors': their
// names start with "envoy:", which no HTTP rule's may (letters, digits, -
// and _ only).
func IsRule(name string) bool { return strings.HasPrefix(name, "envoy:") }
