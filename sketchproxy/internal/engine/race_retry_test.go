package engine

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/rate"
)

// Two requests race for a key's last slot: the one refused by the
// conditional add should get the same Retry-After and RateLimit item as a
// request refused by evaluation.
func TestRaceLoserGetsTheTruth(t *testing.T) {
	e, s, _ := compile(t, RuleSpec{Name: "api", Limits: []LimitSpec{{Name: "m", Rate: rate.Rate{Requests: 100, Per: time.Minute}}}})
	var sc Scratch
	// The Retry-After of a refusal found by evaluation.
	for range 100 {
		decide(e, s, "ref", &sc)
	}
	sc.Reset()
	f := [1]Fact{{Rule: s.Rules[0], Key: "ref"}}
	d := e.Decide(context.Background(), s, e.Now(), &Request{Facts: f[:]}, &sc)
	want, wantField := d.Retry, string(d.Fields.RateLimit)
	d.Done()
	var raced atomic.Int64
	for i := 0; i < 1000 && raced.Load() < 5; i++ {
		key := "k" + strconv.Itoa(i)
		for range 99 {
			decide(e, s, key, &sc)
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var sc Scratch
				f := [1]Fact{{Rule: s.Rules[0], Key: key}}
				<-start
				d := e.Decide(context.Background(), s, e.Now(), &Request{Facts: f[:]}, &sc)
				defer d.Done()
				if !d.Admitted && d.Retry != want {
					raced.Add(1)
					t.Errorf("a request that lost the race for the last slot: Retry %v, RateLimit %q; a refusal by evaluation: Retry %v, RateLimit %q", d.Retry, d.Fields.RateLimit, want, wantField)
				}
			}()
		}
		close(start)
		wg.Wait()
	}
}
