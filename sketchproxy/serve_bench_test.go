package sketchproxy

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// nopWriter is a ResponseWriter that keeps nothing but its headers.
type nopWriter struct{ h http.Header }

func (d *nopWriter) Header() http.Header         { return d.h }
func (d *nopWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *nopWriter) WriteHeader(int)             {}

// BenchmarkServeHTTP is the middleware's own cost per request, in front of
// a handler that does nothing: 10,000 API keys, two limits, every request
// allowed. refused=count is the old decide-while-counting path's workload
// (tarpit rules); refused=free estimates first and counts after.
func BenchmarkServeHTTP(b *testing.B) {
	for _, refused := range []string{"free", "count"} {
		b.Run("refused="+refused, func(b *testing.B) {
			cfg, err := ParseConfig("b", []byte(`rules:
  - name: api
    key: ["header:X-Key"]
    refused: `+refused+`
    limits: [{requests: 100000, per: 1s}, {name: day, requests: 1e9, per: 1d, burst: 133152}]
`))
			if err != nil {
				b.Fatal(err)
			}
			mw, err := New(cfg, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			defer mw.Close()
			r := httptest.NewRequest("GET", "/v1/x", nil)
			w := &nopWriter{h: http.Header{}}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				r.Header.Set("X-Key", "key"+strconv.Itoa(i%10000))
				clear(w.h)
				mw.ServeHTTP(w, r)
			}
		})
	}
}

// BenchmarkSaveState is one state-file save of the example configuration's
// sketches (limits, a wallet, the memory of keys, new keys, bans), fsync
// included: what state_every costs.
func BenchmarkSaveState(b *testing.B) {
	cfg, err := ParseConfig("b", []byte(ExampleConfig))
	if err != nil {
		b.Fatal(err)
	}
	cfg.StateFile = b.TempDir() + "/state"
	mw, err := New(cfg, http.NotFoundHandler(), Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	defer mw.Close()
	var size int64
	mw.state.Load().set.SketchStats(func(_ time.Duration, _ uint32, buckets int, _ engine.Stats) { size += int64(buckets) * 64 })
	b.SetBytes(size)
	for b.Loop() {
		if err := mw.SaveState(); err != nil {
			b.Fatal(err)
		}
	}
}
