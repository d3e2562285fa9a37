//go:build epochsketch_trace

package epochsketch_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/internal/lab"

	"github.com/epochsketch/epochsketch"
)

// Run with: go test -tags epochsketch_trace . (the README's test command
// does). The whole suite also runs in the trace build there, so the traced
// Observe is checked against the reference model like the normal one.

type recorder struct{ evs []lab.Event }

func (r *recorder) ops() string {
	var s []string
	for _, ev := range r.evs {
		s = append(s, ev.Op.String())
	}
	return strings.Join(s, ",")
}

func traced(t *testing.T) *recorder {
	r := &recorder{}
	lab.SetTracer(func(ev lab.Event) { r.evs = append(r.evs, ev) })
	t.Cleanup(func() { lab.SetTracer(nil) })
	return r
}

func (r *recorder) observe(sk *epochsketch.Sketch, key string) (uint32, bool) {
	r.evs = r.evs[:0]
	return sk.Observe(key)
}

func TestTracePhases(t *testing.T) {
	r := traced(t)
	sk, _ := newManualLottery(t, epochsketch.Config{NumBuckets: 1}, chip)

	est, first := r.observe(sk, "a")
	if got := r.ops(); got != "start,claim,result" {
		t.Fatalf("new key: %s", got)
	}
	start, claim, res := r.evs[0], r.evs[1], r.evs[2]
	_, _, tag := lab.Locate(sk, "a")
	if start.Tag != tag || start.Bucket != 0 || start.Second != -1 {
		t.Errorf("start %+v: want tag %04x in bucket 0", start, tag)
	}
	// The start names the key's home slot, hash bits 15..13, and a new key
	// in an empty bucket claims it.
	if home := int(sk.HashString("a") >> 13 & 7); start.Slot != home || claim.Slot != home {
		t.Errorf("start slot %d, claim slot %d: want the home slot %d for both", start.Slot, claim.Slot, home)
	}
	if !claim.OK || claim.Old != 0 || claim.New != lab.Slots(sk, 0)[claim.Slot] {
		t.Errorf("claim %+v: want 0 -> the slot's word %016x", claim, lab.Slots(sk, 0)[claim.Slot])
	}
	if res.Est != est || res.First != first || est != 1 || !first {
		t.Errorf("result %+v, Observe returned (%d, %v)", res, est, first)
	}

	r.observe(sk, "a")
	if got := r.ops(); got != "start,fast-refresh,result" {
		t.Fatalf("tracked key: %s", got)
	}
	if f := r.evs[1]; !f.OK || f.New != f.Old+1 {
		t.Errorf("fast refresh %+v: want the count one up", f)
	}

	// Fill the bucket with 8 keys of 3 counts: a newcomer's chip is sure
	// below 9 counts, and takes one count off the weakest.
	for i := range 7 {
		for range 3 {
			sk.Observe(fmt.Sprint("k", i))
		}
	}
	sk.Observe("a")
	r.observe(sk, "newcomer")
	if got := r.ops(); got != "start,lottery,chip,result" {
		t.Fatalf("full bucket of light keys: %s", got)
	}
	lot, chipped := r.evs[1], r.evs[2]
	if !lot.Sure || !lot.OK || lot.Est != 3 {
		t.Errorf("lottery %+v: want a sure chip against a count of 3", lot)
	}
	if !chipped.OK || chipped.New != chipped.Old-1 || lab.Slots(sk, 0)[chipped.Slot] != chipped.New {
		t.Errorf("chipped %+v: want the weakest one lower", chipped)
	}

	// Heavy keys (600 counts: the mask is 66 bits wide) never lose a count.
	heavy, _ := newManualLottery(t, epochsketch.Config{NumBuckets: 1}, chip)
	for i := range 8 {
		for range 600 {
			heavy.Observe(fmt.Sprint("h", i))
		}
	}
	r.observe(heavy, "mouse")
	if got := r.ops(); got != "start,lottery,bounce,result" {
		t.Fatalf("full bucket of heavy keys: %s", got)
	}
	if lot := r.evs[1]; lot.OK || lot.Bound != ^uint64(0) {
		t.Errorf("lottery %+v: want a lost draw with a full mask", lot)
	}
}

func TestTraceScrubAndHeavyKeeper(t *testing.T) {
	r := traced(t)
	sk, clk := newManual(t, epochsketch.Config{NumBuckets: 1})
	for i := range 8 {
		sk.Observe(fmt.Sprint("k", i))
	}
	clk.Advance(24 * time.Second)
	r.observe(sk, "late")
	scrubs := strings.Count(r.ops(), "scrub")
	if scrubs != 8 || !strings.HasSuffix(r.ops(), "claim,result") {
		t.Fatalf("after 24 silent ticks: %s, want 8 scrubs then a claim", r.ops())
	}
	for i := range 8 {
		sk.Observe(fmt.Sprint("j", i))
	}
	// HeavyKeeper: the draw is the salt, the bound floor(2^64 * 1.08^-c).
	for range 50 {
		r.observe(sk, "challenger")
		for _, ev := range r.evs {
			if ev.Op == lab.Lottery && ev.OK != (ev.Draw < ev.Bound) {
				t.Fatalf("lottery %+v: OK must be Draw < Bound", ev)
			}
		}
	}
}

func TestTraceOffAndTwoChoice(t *testing.T) {
	lab.SetTracer(nil)
	sk, _ := newManual(t, epochsketch.Config{NumBuckets: 4, TwoChoice: true})
	if e, f := sk.Observe("x"); e != 1 || !f {
		t.Fatal("untraced Observe in a trace build")
	}
	r := traced(t)
	r.observe(sk, "x")
	b, b2, _ := lab.Locate(sk, "x")
	if got := r.ops(); got != "start,fast-refresh,result" || r.evs[0].Bucket != b || r.evs[0].Second != b2 {
		t.Fatalf("two-choice: %s, start %+v, want buckets %d and %d", got, r.evs[0], b, b2)
	}
	if r.evs[0].Slot != -1 {
		t.Errorf("two-choice start slot %d: want -1, TwoChoice has no home slot", r.evs[0].Slot)
	}
}
