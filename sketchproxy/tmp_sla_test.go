package sketchproxy

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/testkit"
)

func TestTmpSLA(t *testing.T) {
	l := procLimit{requests: 1, per: time.Second, burst: 1}
	addr := testkit.RedisServer(t)
	ls := warmReplicas(t, 3, l, FleetConfig{Redis: addr})
	type adm struct {
		at  time.Time
		rep int
	}
	var mu sync.Mutex
	logs := make([][]adm, 12)
	var wg sync.WaitGroup
	for k := range 12 {
		wg.Go(func() {
			time.Sleep(time.Duration(k) * l.tick() / 12)
			key := fmt.Sprint("small-at-once-", k)
			for range 100 {
				var w2 sync.WaitGroup
				start := make(chan struct{})
				for i := range 9 {
					w2.Go(func() {
						<-start
						if ls[i%3].Allow(key) {
							mu.Lock()
							logs[k] = append(logs[k], adm{time.Now(), i % 3})
							mu.Unlock()
						}
					})
				}
				close(start)
				w2.Wait()
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	skipIfLate(t, ls)
	tick := l.tick()
	for k, as := range logs {
		// max in any window of 2.1 s
		for i := range as {
			n := 0
			for j := i; j < len(as) && as[j].at.Sub(as[i].at) <= 2100*time.Millisecond; j++ {
				n++
			}
			if n > 3 {
				s := ""
				for _, a := range as {
					s += fmt.Sprintf(" r%d@%d.%03d(t%d)", a.rep, a.at.Unix()%100, a.at.Nanosecond()/1e6, a.at.UnixNano()/int64(tick))
				}
				t.Errorf("key %d: %d in a window: %s", k, n, s)
				break
			}
		}
	}
}
