package main

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy"
)

// BenchmarkProxyOverhead sends real HTTP requests over loopback, in
// parallel, to the upstream alone, through a plain reverse proxy, and
// through SketchProxy (the same reverse proxy behind the middleware, with a
// per-key limit high enough that every request passes and 10,000 keys).
// ns/op is wall time per request across all clients (lower is more
// throughput); p50-ns and p99-ns are request latencies. Client, proxy and
// upstream share the machine's cores. Run with -count 6 and compare with
// benchstat (scripts/sketchproxy-bench.sh).
func BenchmarkProxyOverhead(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from the upstream\n")
	}))
	defer up.Close()
	target, _ := url.Parse(up.URL)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	plain := httptest.NewServer(newReverseProxy(target, time.Minute, log, (*httputil.ProxyRequest).SetXForwarded))
	defer plain.Close()
	// The same limiter twice: with the RateLimit fields on every response
	// (the default), and with headers: {off: true}, whose responses are as
	// small as the plain reverse proxy's.
	start := func(headers string) *httptest.Server {
		cfg, err := sketchproxy.ParseConfig("bench", []byte(headers+`
rules:
  - name: api
    key: ["header:X-Key"]
    tarpit: true
    limits: [{requests: 1000000000, per: 1s, burst: 8000000}, {name: day, requests: 1e12, per: 1d, burst: 8000000}]
`))
		if err != nil {
			b.Fatal(err)
		}
		var mw *sketchproxy.Middleware
		mw, err = sketchproxy.New(cfg, newReverseProxy(target, time.Minute, log, func(pr *httputil.ProxyRequest) { mw.SetForwarded(pr) }), sketchproxy.Options{Logger: log})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { mw.Close() })
		sp := httptest.NewServer(mw)
		b.Cleanup(sp.Close)
		return sp
	}
	sp, spOff := start("headers: {off: false}"), start("headers: {off: true}")

	for _, c := range []struct{ name, url string }{
		{"upstream-alone", up.URL}, {"reverse-proxy", plain.URL}, {"sketchproxy", sp.URL}, {"sketchproxy-headers-off", spOff.URL},
	} {
		b.Run("impl="+c.name, func(b *testing.B) {
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxIdleConns: 256}}
			defer client.CloseIdleConnections()
			var mu sync.Mutex
			var lat []time.Duration
			var seq atomic.Int64
			b.SetParallelism(4) // 4 clients per core keep both sides busy
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				mine := make([]time.Duration, 0, 1024)
				req, _ := http.NewRequest("GET", c.url+"/v1/x", nil)
				id := seq.Add(1)
				i := 0
				for pb.Next() {
					i++
					req.Header.Set("X-Key", "key"+strconv.Itoa(int(id*7919+int64(i))%10000))
					t := time.Now()
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
					mine = append(mine, time.Since(t))
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			})
			b.StopTimer()
			if len(lat) > 0 {
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
				b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
			}
		})
	}
}
