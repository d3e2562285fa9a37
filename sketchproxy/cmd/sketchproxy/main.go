// Command sketchproxy is a fixed-memory reverse proxy for rate limiting,
// tarpitting and wallet defense, built on EpochSketch.
//
// Usage:
//
//	sketchproxy                       a demo: a built-in upstream behind a default rule
//	sketchproxy -config proxy.yaml    the proxy a config describes
//	sketchproxy -config proxy.yaml -check
//	                                  validate the config and exit
//	sketchproxy -example              print a commented config with every section
//
// SIGHUP reloads the config (an invalid one is logged and the running one
// kept); SIGINT and SIGTERM shut down gracefully.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sketchproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "YAML config `file` (none: the demo)")
	check := fs.Bool("check", false, "validate the config and exit")
	example := fs.Bool("example", false, "print a commented example config and exit")
	listen := fs.String("listen", "", "override the config's listen address")
	admin := fs.String("admin", "", "override the config's admin address (\"off\" disables)")
	upstream := fs.String("upstream", "", "override the config's upstream URL")
	jsonLogs := fs.Bool("json", false, "log JSON lines instead of text")
	grace := fs.Duration("grace", 10*time.Second, "how long shutdown waits for requests in progress")
	demoUpstream := fs.String("demo-upstream", "", "only serve the demo upstream on `ADDR` (for load tests)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sketchproxy: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *example {
		fmt.Fprint(stdout, sketchproxy.ExampleConfig)
		return 0
	}
	if *demoUpstream != "" {
		ln, err := net.Listen("tcp", *demoUpstream)
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
	var lh slog.Handler = slog.NewTextHandler(stderr, nil)
	if *jsonLogs {
		lh = slog.NewJSONHandler(stderr, nil)
	}
	log := slog.New(lh)

	load := func() (*sketchproxy.Config, error) {
		var cfg *sketchproxy.Config
		var err error
		if *cfgPath == "" {
			cfg, err = sketchproxy.ParseConfig("demo config", []byte(sketchproxy.DemoConfig))
		} else {
			cfg, err = sketchproxy.LoadConfig(*cfgPath)
		}
		if err != nil {
			return nil, err
		}
		if *listen != "" {
			cfg.Listen = *listen
		}
		if *admin != "" {
			cfg.Admin = *admin
		}
		if *upstream != "" {
			cfg.Upstream = *upstream
		}
		if *cfgPath != "" && cfg.Upstream == "" {
			return nil, fmt.Errorf("%s: upstream: missing: say where to proxy, e.g. upstream: \"http://127.0.0.1:9000\" (or -upstream)", *cfgPath)
		}
		return cfg, cfg.Validate()
	}
	cfg, err := load()
	if err != nil {
		fmt.Fprintf(stderr, "sketchproxy: %v\n", err)
		return 1
	}
	if *check {
		fmt.Fprintf(stdout, "%s: ok, %d rules\n", *cfgPath, len(cfg.Rules))
		return 0
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	demo := *cfgPath == "" && cfg.Upstream == ""
	if demo {
		u, closeDemo, err := startDemoUpstream(log)
		if err != nil {
			fmt.Fprintf(stderr, "sketchproxy: demo upstream: %v\n", err)
			return 1
		}
		defer closeDemo()
		cfg.Upstream = u
	}
	// Both addresses first: a start that cannot listen touches no state
	// file (Close would save the empty sketches over the last good one).
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		fmt.Fprintf(stderr, "sketchproxy: listen: %v (set listen: or -listen)\n", err)
		return 1
	}
	defer ln.Close()
	var aln net.Listener
	if cfg.Admin != "off" {
		if aln, err = net.Listen("tcp", cfg.Admin); err != nil {
			fmt.Fprintf(stderr, "sketchproxy: admin listen: %v (set admin: or -admin, or \"off\")\n", err)
			return 1
		}
		defer aln.Close()
	}
	target, _ := url.Parse(cfg.Upstream)
	var mw *sketchproxy.Middleware
	proxy := newReverseProxy(target, log, func(pr *httputil.ProxyRequest) { mw.SetForwarded(pr) })
	mw, err = sketchproxy.New(cfg, proxy, sketchproxy.Options{Logger: log})
	if err != nil {
		fmt.Fprintf(stderr, "sketchproxy: %v\n", err)
		return 1
	}
	defer mw.Close()
	proxy.Transport = mw.Transport(proxy.Transport) // wallets: usage in trailers, and after the client left

	srv := &http.Server{
		Handler:           mw,
		ReadHeaderTimeout: time.Duration(cfg.Server.ReadHeaderTimeout), // slowloris
		IdleTimeout:       time.Duration(cfg.Server.IdleTimeout),
		MaxHeaderBytes:    cfg.Server.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(lh, slog.LevelWarn),
	}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()

	var adminSrv *http.Server
	if aln != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", mw.MetricsHandler())
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintln(w, "ok")
		})
		adminSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { errc <- adminSrv.Serve(aln) }()
		log.Info("admin listening", "addr", aln.Addr().String(), "metrics", "http://"+aln.Addr().String()+"/metrics")
	}
	log.Info("sketchproxy listening", "addr", ln.Addr().String(), "upstream", cfg.Upstream, "rules", len(cfg.Rules))
	if demo {
		fmt.Fprintf(stdout, "SketchProxy demo: %s proxies to a built-in upstream, 5 requests per 10 s per client.\n", ln.Addr())
		fmt.Fprintf(stdout, "Try, in another terminal:\n\n  for i in $(seq 1 12); do curl -s -o /dev/null -w '%%{http_code} ' http://%s/; done; echo\n\n", ln.Addr())
		fmt.Fprintf(stdout, "The first 5 answer 200, then 429 until the count decays (curl -i shows Retry-After and RateLimit).\n")
	}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-hup:
			if *cfgPath == "" {
				log.Info("reload: the demo has no config file")
				continue
			}
			var rules int
			err := mw.ReloadFrom(func() (*sketchproxy.Config, error) {
				c, err := load()
				if c != nil {
					rules = len(c.Rules)
				}
				return c, err
			})
			if err != nil {
				log.Error("reload failed: keeping the running config", "err", err.Error())
				continue
			}
			log.Info("config reloaded", "rules", rules)
			if now, _ := load(); now != nil && (now.Listen != cfg.Listen || now.Admin != cfg.Admin || now.Upstream != cfg.Upstream) {
				log.Warn("listen, admin and upstream changes take a restart; the rules were reloaded")
			}
		case err := <-errc:
			if !errors.Is(err, http.ErrServerClosed) {
				log.Error("server stopped", "err", err.Error())
				return 1
			}
		case <-ctx.Done():
			log.Info("shutting down", "grace", grace.String())
			sctx, cancel := context.WithTimeout(context.Background(), *grace)
			defer cancel()
			err := srv.Shutdown(sctx)
			if adminSrv != nil {
				adminSrv.Shutdown(sctx)
			}
			if err != nil {
				log.Warn("shutdown: requests still running at the grace limit", "err", err.Error())
			}
			log.Info("stopped")
			return 0
		}
	}
}

// newReverseProxy proxies to target, keeping the client's Host, setting the
// forwarding headers with forwarded (the Middleware's SetForwarded),
// passing streams (SSE flushes at once) and WebSocket upgrades, and
// answering upstream failures with a 502 problem (408 for a request body
// that passed server.body_timeout).
func newReverseProxy(target *url.URL, log *slog.Logger, forwarded func(*httputil.ProxyRequest)) *httputil.ReverseProxy {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: 5 * time.Second,
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host
			forwarded(pr)
		},
		Transport: tr,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) {
				return // the client left
			}
			if errors.Is(err, sketchproxy.ErrBodyTimeout) {
				w.Header().Set("Connection", "close")
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(http.StatusRequestTimeout)
				fmt.Fprintf(w, `{"type":"about:blank","title":"Request Timeout","status":408,"detail":"the request body did not arrive within server.body_timeout"}`+"\n")
				return
			}
			log.Warn("upstream error", "err", err.Error(), "path", r.URL.Path)
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusBadGateway)
			fmt.Fprintf(w, `{"type":"about:blank","title":"Bad Gateway","status":502,"detail":"the upstream did not answer"}`+"\n")
		},
	}
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
