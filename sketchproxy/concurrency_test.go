package sketchproxy

import (
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

// Requests, reloads, state saves and metrics scrapes all at once: run under
// -race (the README's test command does), nothing may race or fail.
func TestConcurrentRequestsReloadsSavesAndScrapes(t *testing.T) {
	dir := t.TempDir()
	conf := func(limit int) string {
		// A small sketch: the test is of the races, and each save writes
		// every sketch.
		return fmt.Sprintf(`state_file: %s
sketch: {buckets: 4096}
rules:
  - name: api
    key: ["header:X-Key"]
    tarpit: true
    limits: [{name: r, requests: %d, per: 10s}]
    budget: {units: 100000, per: 1d, cost: 2, reconcile_header: X-Tokens-Used}
    max_in_flight: 4
  - name: ip
    shadow: true
    limits: [{name: r, requests: 50, per: 10s}]
`, filepath.Join(dir, "state"), limit)
	}
	h := newHarness(t, conf(20))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var served atomic.Int64
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				w := h.req(fmt.Sprintf("198.51.100.%d", g), "X-Key", fmt.Sprint("k", i%50), "X-Test-Tokens", "7")
				if w.Code != 200 && w.Code != 429 {
					t.Errorf("status %d: %s", w.Code, w.Body.String())
					return
				}
				served.Add(1)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 15; i++ {
			cfg, err := ParseConfig("r.yaml", []byte(conf(10+i%3*10)))
			if err != nil {
				t.Error(err)
				return
			}
			if err := h.mw.Reload(cfg); err != nil {
				t.Error(err)
				return
			}
			if err := h.mw.SaveState(); err != nil {
				t.Error(err)
				return
			}
			w := httptest.NewRecorder()
			h.mw.MetricsHandler().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
		}
		close(stop)
	}()
	wg.Wait()
	if served.Load() == 0 {
		t.Fatal("no request served")
	}
}
