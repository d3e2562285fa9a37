package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

// serveDemoUpstream serves only the demo upstream, for load tests, until
// SIGINT or SIGTERM.
func serveDemoUpstream(addr string, stdout, stderr io.Writer) int {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(stderr, "sketchproxy: -demo-upstream: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "demo upstream on http://%s/\n", ln.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv := &http.Server{Handler: demoMux(), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	<-ctx.Done()
	srv.Close()
	return 0
}

// printDemo tells the demo's user what to try.
func printDemo(stdout io.Writer, addr string) {
	fmt.Fprintf(stdout, "SketchProxy demo: %s proxies to a built-in upstream, 5 requests per 10 s per client.\n", addr)
	fmt.Fprintf(stdout, "Try, in another terminal:\n\n  for i in $(seq 1 12); do curl -s -o /dev/null -w '%%{http_code} ' http://%s/; done; echo\n\n", addr)
	fmt.Fprintf(stdout, "The first 5 answer 200, then 429 until the count decays (curl -i shows Retry-After and RateLimit).\n")
}

// startDemoUpstream serves a small upstream on loopback: / says hello,
// /stream is server-sent events, /tokens reports tokens used.
func startDemoUpstream(log *slog.Logger) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: demoMux(), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	log.Info("demo upstream", "addr", ln.Addr().String())
	return "http://" + ln.Addr().String(), func() { srv.Close() }, nil
}

func demoMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from the demo upstream (%s %s)\n", r.Method, r.URL.Path)
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for i := range 5 {
			fmt.Fprintf(w, "data: event %d\n\n", i)
			rc.Flush()
			select {
			case <-time.After(200 * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
	})
	mux.HandleFunc("/tokens", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Tokens-Used", strconv.Itoa(10+rand.IntN(190)))
		fmt.Fprintln(w, "a reply that cost some tokens")
	})
	return mux
}
