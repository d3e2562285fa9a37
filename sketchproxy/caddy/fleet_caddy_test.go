package caddyepochsketch

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fleetSite is two Caddys' Caddyfile: on {{PORT}}, zones whose counts the
// fleet shares through Redis ({{REDIS}}, the secret in {{SECRET_FILE}}),
// at the fleet's defaults otherwise (interval 500ms, replicas counted by
// heartbeat); on {{PORT2}}, the fast zone without a fleet: one Caddy
// alone, to compare with.
const fleetSite = `http://127.0.0.1:{{PORT}} {
	header X-Gen {{GEN}}
	epochsketch {
		zone fast {
			key {header.X-Client}
			events 10
			window 1s
			match {
				path /fast
			}
		}
		zone hour {
			key {header.X-Client}
			events 4
			window 1h
			match {
				path /hour
			}
		}
		fleet {
			redis {{REDIS}}
			secret_file {{SECRET_FILE}}
		}
	}
	respond "fleet"
}
http://127.0.0.1:{{PORT2}} {
	epochsketch {
		zone fast {
			key {header.X-Client}
			events 10
			window 1s
		}
	}
	respond "alone"
}
`

// fleetLogReachable is the fleet's log line when a round first succeeds:
// once per fleet started, and again after an outage.
const fleetLogReachable = "fleet: Redis reachable: enforcing fleet-wide limits"

// TestCaddyFleet runs a real redis-server and two Caddys built with the
// module, their zones in one fleet (issue 38, point 7: distributed
// counts). Clients alternating between the two at 4 times their limit are
// admitted what one Caddy alone admits of the same requests, sent at the
// same instants: never more than 5% (or one request a client) over it,
// within 5% from the second second on, and at least 0.6 of it in the
// first (where a key is young and the fleet admits less); a reload that keeps
// the fleet keeps the fleet and the counts; with Redis killed, each Caddy
// enforces θ/N alone and no request fails.
func TestCaddyFleet(t *testing.T) {
	redis, killRedis := startRedisServer(t)
	secret := filepath.Join(t.TempDir(), "fleet-secret")
	if err := os.WriteFile(secret, []byte("a-per-deployment-secret-of-16-bytes-or-more\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	site := strings.NewReplacer("{{REDIS}}", redis, "{{SECRET_FILE}}", secret).Replace(fleetSite)
	a, b := startCaddy(t, site, ""), startCaddy(t, site, "")
	// Both fleets are up, and have heard each other's heartbeat (N = 2)
	// after a round or two.
	for _, s := range []*caddyServer{a, b} {
		waitLog(t, s, fleetLogReachable, 1)
	}
	time.Sleep(1500 * time.Millisecond)
	replicas := [2]*caddyServer{a, b}
	c := &http.Client{Timeout: 10 * time.Second}

	// The limiter runs there: a probe client alternating between the two
	// gets a 429 with the RateLimit field.
	var probe []string
	var refused answer
	for i := range 16 {
		ans := get(t, c, replicas[i%2].url("/fast"), "X-Client", "probe")
		probe = append(probe, fmt.Sprint(ans.code))
		if ans.code == http.StatusTooManyRequests && refused.code == 0 {
			refused = ans
		}
	}
	if refused.code != http.StatusTooManyRequests || !strings.Contains(refused.rateLimit, `"fast-per-1s";r=0;t=`) || refused.retryAfter == "" {
		t.Fatalf("16 requests at once at 10 a second over the two Caddys: %s; first refusal RateLimit %q, Retry-After %q: want a 429 with both",
			strings.Join(probe, " "), refused.rateLimit, refused.retryAfter)
	}

	// The measure: 3 clients, each at 40 requests a second (4 times its
	// limit) for 10 s, each request sent to the fleet (a and b in turn)
	// and to one Caddy alone at the same instant. The fleet's error is in
	// its first second (a young key's requests claim and wait, and a
	// guarantee follows demand a round late: docs/fleets.md, Worst cases),
	// so the run is as long as the first 10 s of SketchProxy's own measure.
	const clients, every, length = 3, 25 * time.Millisecond, 10 * time.Second
	type tally struct{ sent, fleet, alone int }
	var tallies [clients]tally
	var perSec [2][int(length/time.Second) + 1]int // admitted in each second: the fleet's, alone
	var failed []string
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for k := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("client-%d", k)
			time.Sleep(time.Duration(k) * every / clients) // apart from the others
			tk := time.NewTicker(every)
			defer tk.Stop()
			for i := 0; time.Since(start) < length; i++ {
				f, err1 := code(c, replicas[i%2].url("/fast"), key)
				one, err2 := code(c, "http://127.0.0.1:"+fmt.Sprint(a.port2)+"/", key)
				mu.Lock()
				tl := &tallies[k]
				tl.sent++
				sec := min(int(time.Since(start)/time.Second), len(perSec[0])-1)
				perSec[0][sec] += btoi(f == http.StatusOK)
				perSec[1][sec] += btoi(one == http.StatusOK)
				tl.fleet += btoi(f == http.StatusOK)
				tl.alone += btoi(one == http.StatusOK)
				for _, e := range []error{err1, err2} {
					if e != nil {
						failed = append(failed, e.Error())
					}
				}
				mu.Unlock()
				<-tk.C
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	t.Logf("admitted in each second: the fleet %v, one Caddy alone %v", perSec[0], perSec[1])
	var sent, fleet, alone int
	for k, tl := range tallies {
		t.Logf("client-%d: %d requests, the fleet admitted %d, one Caddy alone %d", k, tl.sent, tl.fleet, tl.alone)
		sent, fleet, alone = sent+tl.sent, fleet+tl.fleet, alone+tl.alone
	}
	rate := float64(sent) / clients / elapsed.Seconds()
	t.Logf("%d requests of %d clients in %v (%.1f a second a client, %.1fx the limit): the fleet of 2 admitted %d, one Caddy alone %d (%.3f)",
		sent, clients, elapsed.Round(time.Millisecond), rate, rate/10, fleet, alone, float64(fleet)/float64(alone))
	if len(failed) > 0 {
		t.Errorf("%d requests failed: %q", len(failed), failed[:min(len(failed), 5)])
	}
	if rate < 20 {
		t.Fatalf("%.1f requests a second a client: under 2 times the limit, this run measured nothing", rate)
	}
	if alone >= sent {
		t.Fatalf("one Caddy alone refused nothing of %d: the limit never ran", sent)
	}
	// Never more than 5% (or a request a client) over one Caddy alone,
	// over the whole run; within 5% of it from the second second on (the
	// steady state); at least 0.6 of it in the first second. There each
	// key is young: its requests claim and wait, and a guarantee follows
	// demand a round late, so the fleet admits less (43 to 58 against 57,
	// which put the whole run at 0.948 to 0.994 of one Caddy alone in 12
	// runs: under 0.95 once, the old test's bound).
	if fleet > alone+clients && float64(fleet) > 1.05*float64(alone) {
		t.Errorf("the fleet of 2 admitted %d, one Caddy alone %d: more than 5%% (and more than a request a client) over it", fleet, alone)
	}
	if float64(perSec[0][0]) < 0.6*float64(perSec[1][0]) {
		t.Errorf("in the first second the fleet of 2 admitted %d, one Caddy alone %d: under 0.6 of it", perSec[0][0], perSec[1][0])
	}
	fleetAfter, aloneAfter := fleet-perSec[0][0], alone-perSec[1][0]
	if d := math.Abs(float64(fleetAfter - aloneAfter)); d > 0.05*float64(aloneAfter) && d > clients {
		t.Errorf("from the second second on, the fleet of 2 admitted %d, one Caddy alone %d: more than 5%% (and more than a request a client) apart", fleetAfter, aloneAfter)
	}
	// Caddy's metrics name the zone, not its rule in the fleet's engine.
	if v := a.metric(`caddy_http_epochsketch_decisions_total{outcome="reject",zone="fast"}`); v <= 0 {
		t.Errorf("the fast zone's refusals in a's metrics: %v, want some", v)
	}

	// A reload of a that keeps the fleet's settings keeps the fleet (no
	// second start in its log) and the zones' counts: a client that spent
	// all of 4 an hour on a stays refused there. (Its first burst gets θ/N
	// while the key is young, two intervals; after that a may take the
	// share b leaves unused.)
	offTheEdge(t) // hour's counts halve every 30 minutes
	var held []string
	admitted := 0
	for i := range 8 {
		if i == 3 {
			time.Sleep(1500 * time.Millisecond)
		}
		ans := get(t, c, a.url("/hour"), "X-Client", "held")
		held = append(held, fmt.Sprint(ans.code))
		admitted += btoi(ans.code == http.StatusOK)
	}
	t.Logf("held on a, 3 requests, 1.5 s, 5 more: %s", strings.Join(held, " "))
	if got := strings.Join(held, " "); !strings.HasSuffix(got, "429 429") || admitted > 4 {
		t.Fatalf("8 requests on a at 4 an hour over 2 replicas: %s, want at most 4 admitted, then refusals", got)
	}
	a.reload(site, 2)
	ans := get(t, c, a.url("/hour"), "X-Client", "held")
	if ans.gen != "2" {
		t.Fatalf("X-Gen %q after the reload, want 2", ans.gen)
	}
	if ans.code != http.StatusTooManyRequests || !strings.Contains(ans.rateLimit, `"hour-per-1h";r=0;`) {
		t.Errorf("after the reload: %d, RateLimit %q; want 429, the counts kept", ans.code, ans.rateLimit)
	}
	if n := strings.Count(a.log.String(), fleetLogReachable); n != 1 {
		t.Errorf("the fleet started %d times in a's log, want once: the reload should keep it", n)
	}

	// Redis down: each Caddy enforces θ/N of each limit alone (2 of 4 an
	// hour), and no request fails, during the loss or after it.
	stop := make(chan struct{})
	var during sync.WaitGroup
	var duringSent int
	during.Add(1)
	go func() {
		defer during.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			_, err := code(c, replicas[i%2].url("/fast"), "through-the-loss")
			mu.Lock()
			duringSent++
			if err != nil {
				failed = append(failed, err.Error())
			}
			mu.Unlock()
		}
	}()
	killRedis()
	for _, s := range []*caddyServer{a, b} {
		waitLog(t, s, "fleet: Redis unreachable: enforcing limits locally at 1/N", 1)
	}
	for _, s := range []*caddyServer{a, b} {
		var got []string
		for range 4 {
			got = append(got, fmt.Sprint(get(t, c, s.url("/hour"), "X-Client", "while-down").code))
		}
		if strings.Join(got, " ") != "200 200 429 429" {
			t.Errorf("4 requests on Caddy :%d at 4 an hour, Redis down: %s, want 200 200 429 429 (θ/N, N = 2)", s.port, strings.Join(got, " "))
		}
	}
	close(stop)
	during.Wait()
	t.Logf("%d requests sent through the loss of Redis", duringSent)
	if len(failed) > 0 {
		t.Errorf("%d requests failed: %q", len(failed), failed[:min(len(failed), 5)])
	}
}

// code sends a GET of url as client key; it returns the status, and an
// error for a request that failed (no answer, or neither 200 nor 429).
func code(c *http.Client, url, key string) (int, error) {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("X-Client", key)
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
		return resp.StatusCode, errors.New(url + ": " + resp.Status)
	}
	return resp.StatusCode, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// waitLog waits until s's log holds line n times (10 s at most).
func waitLog(t *testing.T, s *caddyServer, line string, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); strings.Count(s.log.String(), line) < n; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in Caddy's log after 10 s", line)
		}
	}
}
