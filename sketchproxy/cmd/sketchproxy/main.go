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
//	sketchproxy -example minimal      print the smallest deployable config
//	sketchproxy -config proxy.yaml -key-label 203.0.113.7
//	                                  print the label logs and metrics show
//	                                  for a key (key_label_secret_file)
//
// With forward_auth in the config it also answers a gateway's checks (nginx
// auth_request, Caddy forward_auth, Traefik ForwardAuth), and with envoy_rls
// Envoy's rate-limit service over gRPC; either can run without an upstream.
//
// SIGHUP reloads the config (an invalid one is logged and the running one
// kept); SIGUSR2 hands the listeners over to a new process, the binary at
// the same path, with no gap (handover.go); SIGINT and SIGTERM shut down
// gracefully.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/epochsketch/epochsketch/sketchproxy"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	o, code := parseFlags(args, stderr)
	switch {
	case code >= 0:
		return code
	case o.example != "":
		fmt.Fprint(stdout, examples[o.example])
		return 0
	case o.demoUpstream != "":
		return serveDemoUpstream(o.demoUpstream, stdout, stderr)
	}
	cfg, lh, log, code := o.prepare(stdout, stderr)
	if code >= 0 {
		return code
	}
	return o.start(cfg, lh, log, stdout, stderr)
}

// prepare sets up the logs, loads and checks the config, and answers
// -key-label and -check; code is -1 when the proxy is to start.
func (o *options) prepare(stdout, stderr io.Writer) (cfg *sketchproxy.Config, lh slog.Handler, log *slog.Logger, code int) {
	if os.Getenv(handoverEnv) != "" {
		// A handover's successor starts (its config, its sketches, the
		// state file: about 100 ms of CPU for 13 MB) on one CPU, and
		// leaves the others to the predecessor, which answers every call
		// meanwhile; it takes them all once it serves (serving).
		o.procs = runtime.GOMAXPROCS(1)
	}
	lh = slog.NewTextHandler(stderr, nil)
	if o.jsonLogs {
		lh = slog.NewJSONHandler(stderr, nil)
	}
	log = slog.New(lh)
	cfg, err := o.load()
	if err != nil {
		fmt.Fprintf(stderr, "sketchproxy: %v\n", err)
		return nil, nil, nil, 1
	}
	if o.keyLabel != "" {
		return nil, nil, nil, printKeyLabels(cfg, o.keyLabel, stdout, stderr)
	}
	// A state file that cannot be written would fail every save, the
	// last at the stop too: refused here, by -check as at a start.
	if err := sketchproxy.CheckStateFile(cfg.StateFile); err != nil {
		fmt.Fprintf(stderr, "sketchproxy: %v\n", err)
		return nil, nil, nil, 1
	}
	warnings := configWarnings(cfg)
	if o.check {
		o.printCheck(cfg, warnings, stdout, stderr)
		return nil, nil, nil, 0
	}
	for _, w := range warnings {
		log.Warn("config: " + w)
	}
	return cfg, lh, log, -1
}

// start listens, serves until a stop or a handover, and closes the
// middleware (its last state save).
func (o *options) start(cfg *sketchproxy.Config, lh slog.Handler, log *slog.Logger, stdout, stderr io.Writer) int {
	var err error
	o.running = &running{changed: make(chan struct{}, 1)}
	o.current.Store(cfg)
	if o.sockets, o.ready, o.handedState, err = inheritedSockets(); err != nil {
		fmt.Fprintf(stderr, "sketchproxy: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// SIGHUP and SIGUSR2 are caught from here on: their default action
	// ends the process, and one sent as soon as the log says a listener
	// serves must reload or hand over, not kill it.
	o.hup, o.usr2 = make(chan os.Signal, 1), make(chan os.Signal, 1)
	signal.Notify(o.hup, syscall.SIGHUP)
	signal.Notify(o.usr2, syscall.SIGUSR2)
	defer signal.Stop(o.hup)
	defer signal.Stop(o.usr2)

	demo := o.cfgPath == "" && cfg.Upstream == ""
	if demo {
		u, closeDemo, err := startDemoUpstream(log)
		if err != nil {
			fmt.Fprintf(stderr, "sketchproxy: demo upstream: %v\n", err)
			return 1
		}
		defer closeDemo()
		cfg.Upstream = u
	}
	// Every address first: a start that cannot listen touches no state
	// file (Close would save the empty sketches over the last good one).
	lns, err := o.listenAll(cfg, log)
	defer lns.close()
	if err != nil {
		fmt.Fprintf(stderr, "sketchproxy: %v\n", err)
		return 1
	}
	var tlsw *sketchproxy.GRPCTLS // the gRPC listener's TLS, if any
	if lns.grpc != nil {
		if tlsw, err = sketchproxy.NewGRPCTLS(cfg); err != nil {
			fmt.Fprintf(stderr, "sketchproxy: %v\n", err)
			return 1
		}
	}
	mw, err := o.newMiddleware(cfg, log)
	if err != nil {
		fmt.Fprintf(stderr, "sketchproxy: %v\n", err)
		return 1
	}
	defer mw.Close()
	o.restoreHandedState(mw)

	errc := make(chan error, 4) // one per server: forward_auth, main, admin, gRPC
	servers := o.serveHTTP(cfg, mw, lns, lh, errc, log)
	var gs *grpc.Server
	if lns.grpc != nil {
		gs = o.serveGRPC(ctx, cfg, mw, lns.grpc, tlsw, errc, log)
	}
	logListening(cfg, lns, log)
	if demo {
		printDemo(stdout, lns.main.Addr().String())
	}
	o.serving(log)
	code := o.serve(ctx, cfg, mw, servers, gs, errc, log)
	// The last save failed (Close logged it at ERROR): the counts since the
	// last good save are lost, and a service manager should say so.
	if err := mw.Close(); err != nil && code == 0 {
		return 1
	}
	return code
}

// newMiddleware is the decision middleware in front of cfg's upstream (a
// reverse proxy whose transport reports wallets' usage), or in front of
// noUpstream where a config has none.
func (o *options) newMiddleware(cfg *sketchproxy.Config, log *slog.Logger) (*sketchproxy.Middleware, error) {
	var next http.Handler = noUpstream
	var proxy *httputil.ReverseProxy
	var mw *sketchproxy.Middleware
	if cfg.Upstream != "" {
		target, _ := url.Parse(cfg.Upstream)
		proxy = newReverseProxy(target, time.Duration(cfg.Server.UpstreamTimeout), log, func(pr *httputil.ProxyRequest) { mw.SetForwarded(pr) })
		next = proxy
	}
	mw, err := sketchproxy.New(cfg, next, sketchproxy.Options{Logger: log, RefusalLogInterval: o.refusalLogEvery})
	if err != nil {
		return nil, err
	}
	if proxy != nil {
		proxy.Transport = mw.Transport(proxy.Transport) // wallets: usage in trailers, and after the client left
	}
	return mw, nil
}

// serveHTTP serves the HTTP listeners of l (forward_auth's own, the main
// one, admin) and returns their servers; each sends its end to errc.
func (o *options) serveHTTP(cfg *sketchproxy.Config, mw *sketchproxy.Middleware, l *listeners, lh slog.Handler, errc chan<- error, log *slog.Logger) []*http.Server {
	var servers []*http.Server
	// The middleware answers the check's path itself, in every spelling,
	// when the check shares the main listener; on its own listener the
	// check answers 404 to any other path.
	if l.forwardAuth != nil {
		fsrv := o.newServer(cfg, mw.ForwardAuth(), lh)
		go func() { errc <- fsrv.Serve(l.forwardAuth) }()
		servers = append(servers, fsrv)
	}
	if l.main != nil {
		srv := o.newServer(cfg, mw, lh)
		go func() { errc <- srv.Serve(l.main) }()
		servers = append(servers, srv)
	}
	if adminSrv := serveAdmin(cfg, l.admin, mw, o.draining.Load, errc, log); adminSrv != nil {
		servers = append(servers, adminSrv)
	}
	return servers
}

// printCheck prints -check's verdict on cfg: its warnings on stderr, and
// what it holds on stdout.
func (o *options) printCheck(cfg *sketchproxy.Config, warnings []string, stdout, stderr io.Writer) {
	for _, w := range warnings {
		fmt.Fprintf(stderr, "%s: warning: %s\n", o.cfgPath, w)
	}
	fmt.Fprintf(stdout, "%s: ok, %s", o.cfgPath, plural(len(cfg.Rules), "rule"))
	if d, n, l := cfg.EnvoyRLS.Loaded(); d > 0 {
		fmt.Fprintf(stdout, ", envoy_rls: %d domains, %d descriptors (%d with a rate_limit)", d, n, l)
	}
	if len(warnings) > 0 {
		fmt.Fprintf(stdout, " (%s on standard error)", plural(len(warnings), "warning"))
	}
	fmt.Fprintln(stdout)
}

// listeners are the sockets a config asks for; a nil one is not asked for.
type listeners struct {
	main, admin net.Listener
	forwardAuth net.Listener // forward_auth's own listener, if it has one
	grpc        net.Listener // Envoy's rate-limit service
}

func (l *listeners) close() {
	for _, ln := range []net.Listener{l.main, l.admin, l.forwardAuth, l.grpc} {
		if ln != nil {
			ln.Close()
		}
	}
}

// listenAll binds (or inherits) every listener cfg asks for; on an error
// the ones bound so far are in the result, for close.
func (o *options) listenAll(cfg *sketchproxy.Config, log *slog.Logger) (*listeners, error) {
	l := &listeners{}
	var err error
	if l.main, l.admin, err = o.listenBoth(cfg); err != nil {
		return l, err
	}
	if fa := cfg.ForwardAuth; fa != nil && fa.Listen != "" {
		if l.forwardAuth, err = o.bind("forward_auth", fa.Listen); err != nil {
			return l, fmt.Errorf("forward_auth listen: %v (set forward_auth.listen)", err)
		}
	}
	if r := cfg.EnvoyRLS; r != nil {
		if l.grpc, err = o.bind("envoy_rls", r.Listen); err != nil {
			return l, fmt.Errorf("envoy_rls listen: %v (set envoy_rls.listen)", err)
		}
	}
	return l, o.unclaimedSockets(log)
}

// serveGRPC serves Envoy's rate-limit service and gRPC health on gln, with
// tlsw's credentials if it has any, and watches the config's files.
func (o *options) serveGRPC(ctx context.Context, cfg *sketchproxy.Config, mw *sketchproxy.Middleware, gln net.Listener, tlsw *sketchproxy.GRPCTLS, errc chan<- error, log *slog.Logger) *grpc.Server {
	gopts := []grpc.ServerOption{
		grpc.MaxConcurrentStreams(1024), grpc.KeepaliveParams(cfg.EnvoyRLS.Keepalive()),
		grpc.ConnectionTimeout(time.Duration(cfg.EnvoyRLS.ConnectionTimeout)), // "PRI" and silence
	}
	tlsMode := "off"
	if tlsw != nil {
		gopts = append(gopts, grpc.Creds(tlsw.Credentials()))
		tlsMode = "on"
		if cfg.EnvoyRLS.TLS.ClientCAFile != "" {
			tlsMode = "mutual"
		}
	}
	gs := grpc.NewServer(append(gopts, sketchproxy.RateLimitServerOptions()...)...)
	o.health = mw.RegisterRateLimitServiceWithHealth(gs)
	lim, lowered := grpcConnLimits(cfg.EnvoyRLS, descriptorLimit())
	if lowered {
		log.Warn("envoy_rls.max_connections lowered to half the file descriptor limit", "max_connections", lim.Total, "configured", cfg.EnvoyRLS.MaxConnections)
	}
	capped := capListener(gln, "envoy_rls", lim, log)
	go func() { errc <- gs.Serve(capped) }()
	domains, _, _ := cfg.EnvoyRLS.Loaded() // files and the directory's included
	log.Info("envoy rate limit service listening", "protocol", "grpc", "addr", gln.Addr().String(),
		"service", "envoy.service.ratelimit.v3.RateLimitService", "domains", domains, "tls", tlsMode)
	go o.watch(ctx, time.Duration(cfg.EnvoyRLS.WatchEvery), tlsw, log)
	return gs
}

// logListening logs the HTTP listeners' addresses, as the README shows.
func logListening(cfg *sketchproxy.Config, l *listeners, log *slog.Logger) {
	switch {
	case cfg.Upstream != "":
		log.Info("sketchproxy listening", "addr", l.main.Addr().String(), "upstream", cfg.Upstream, "rules", len(cfg.Rules))
	case l.main != nil:
		log.Info("sketchproxy listening", "addr", l.main.Addr().String(), "upstream", "none: forward_auth only", "rules", len(cfg.Rules))
	}
	if fa := cfg.ForwardAuth; fa != nil {
		addr := ""
		if l.main != nil {
			addr = l.main.Addr().String()
		}
		if l.forwardAuth != nil {
			addr = l.forwardAuth.Addr().String()
		}
		log.Info("forward_auth listening", "addr", addr, "check", "http://"+addr+fa.Path, "refusal_status", fa.RefusalStatus)
	}
}

// newServer is an http.Server with the config's client bounds. Its
// connections are counted, and once a handover is under way its answers
// close their connections (Connection: close), so that a gateway's
// keep-alive connections to this process end after an answer, never
// while a request is on its way (handover.go, stop).
func (o *options) newServer(cfg *sketchproxy.Config, h http.Handler, lh slog.Handler) *http.Server {
	return &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if o.closing.Load() {
				w.Header().Set("Connection", "close")
			}
			h.ServeHTTP(w, r)
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			switch s {
			case http.StateNew:
				o.conns.Add(1)
			case http.StateClosed, http.StateHijacked:
				o.conns.Add(-1)
			}
		},
		ReadHeaderTimeout: time.Duration(cfg.Server.ReadHeaderTimeout), // slowloris
		IdleTimeout:       time.Duration(cfg.Server.IdleTimeout),
		MaxHeaderBytes:    cfg.Server.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(lh, slog.LevelWarn),
	}
}

// noUpstream answers what a forward-auth-only proxy is asked besides its check.
var noUpstream = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(http.StatusNotFound)
	fmt.Fprintf(w, `{"type":"about:blank","title":"Not Found","status":404,"detail":"no upstream: this sketchproxy answers only its forward_auth path"}`+"\n")
})

// options are the command's flags.
type options struct {
	cfgPath, listen, admin, upstream, demoUpstream string
	keyLabel                                       string
	check, jsonLogs                                bool
	example                                        exampleFlag
	grace, refusalLogEvery, drainFor               time.Duration
	handoverTimeout                                time.Duration
	// procs is GOMAXPROCS to restore once this process, a handover's
	// successor, serves (0: unchanged).
	procs int

	*running // set by run
}

// parseFlags reads the flags; code >= 0 means exit with it (help, or a
// usage error, 2).
func parseFlags(args []string, stderr io.Writer) (o options, code int) {
	fs := flag.NewFlagSet("sketchproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.cfgPath, "config", "", "YAML config `file` (none: the demo)")
	fs.BoolVar(&o.check, "check", false, "validate the config and exit")
	fs.Var(&o.example, "example", "print a commented config with every section and exit; -example minimal: the smallest deployable config")
	fs.StringVar(&o.listen, "listen", "", "override the config's listen address")
	fs.StringVar(&o.admin, "admin", "", "override the config's admin address (\"off\" disables)")
	fs.StringVar(&o.upstream, "upstream", "", "override the config's upstream URL")
	fs.BoolVar(&o.jsonLogs, "json", false, "log JSON lines instead of text")
	fs.DurationVar(&o.grace, "grace", 10*time.Second, "how long shutdown waits for requests in progress")
	fs.DurationVar(&o.drainFor, "drain", 0, "on SIGTERM, report NOT_SERVING (gRPC health, /healthz 503) and keep serving this long before the listeners close")
	fs.DurationVar(&o.handoverTimeout, "handover-timeout", 30*time.Second, "on SIGUSR2, how long the successor may take to serve before the handover is given up")
	fs.DurationVar(&o.refusalLogEvery, "refusal-log-every", sketchproxy.DefaultRefusalLogInterval, "log each rule's first refusal of this interval, and one line counting the rest at its end")
	fs.StringVar(&o.demoUpstream, "demo-upstream", "", "only serve the demo upstream on `ADDR` (for load tests)")
	fs.StringVar(&o.keyLabel, "key-label", "", "print the label logs and metrics show for the key `VALUE` (a client address: for its ip key part too) under the config's key_label_secret_file, and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, 0
		}
		return o, 2
	}
	if o.example != "" && fs.NArg() == 1 { // -example minimal
		if err := o.example.Set(fs.Arg(0)); err != nil {
			fmt.Fprintf(stderr, "sketchproxy: %v\n", err)
			return o, 2
		}
		return o, -1
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sketchproxy: unexpected argument %q\n", fs.Arg(0))
		return o, 2
	}
	if o.refusalLogEvery <= 0 {
		fmt.Fprintf(stderr, "sketchproxy: -refusal-log-every %v: want a positive interval\n", o.refusalLogEvery)
		return o, 2
	}
	return o, -1
}

// load reads the config (or the demo's) and applies the flags' overrides.
func (o *options) load() (*sketchproxy.Config, error) {
	var cfg *sketchproxy.Config
	var err error
	if o.cfgPath == "" {
		cfg, err = sketchproxy.ParseConfig("demo config", []byte(sketchproxy.DemoConfig))
	} else {
		cfg, err = sketchproxy.LoadConfig(o.cfgPath)
	}
	if err != nil {
		return nil, err
	}
	if o.listen != "" {
		cfg.Listen = o.listen
	}
	if o.admin != "" {
		cfg.Admin = o.admin
	}
	if o.upstream != "" {
		cfg.Upstream = o.upstream
	}
	if o.cfgPath != "" && cfg.Upstream == "" && cfg.ForwardAuth == nil && cfg.EnvoyRLS == nil {
		return nil, fmt.Errorf("%s: upstream: missing: say where to proxy, e.g. upstream: \"http://127.0.0.1:9000\" (or -upstream), or add forward_auth or envoy_rls to answer a gateway only", o.cfgPath)
	}
	return cfg, cfg.Validate()
}

// listenBoth binds the proxy's address and, unless "off", the admin one.
func (o *options) listenBoth(cfg *sketchproxy.Config) (ln, aln net.Listener, err error) {
	// The main listener serves the proxy, or the forward-auth check when it
	// has no address of its own; a gateway-only config may need neither.
	if cfg.Upstream != "" || cfg.ForwardAuth != nil && cfg.ForwardAuth.Listen == "" {
		if ln, err = o.bind("listen", cfg.Listen); err != nil {
			return nil, nil, fmt.Errorf("listen: %v (set listen: or -listen)", err)
		}
	}
	if cfg.Admin == "off" {
		return ln, nil, nil
	}
	if aln, err = o.bind("admin", cfg.Admin); err != nil {
		if ln != nil {
			ln.Close()
		}
		return nil, nil, fmt.Errorf("admin listen: %v (set admin: or -admin, or \"off\")", err)
	}
	return ln, aln, nil
}

// serveAdmin serves /metrics and /healthz on aln, if any; /healthz answers
// 503 once draining.
func serveAdmin(cfg *sketchproxy.Config, aln net.Listener, mw *sketchproxy.Middleware, draining func() bool, errc chan<- error, log *slog.Logger) *http.Server {
	if aln == nil {
		return nil
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", mw.MetricsHandler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if draining() {
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	// Its keep-alives end as the proxy's do (they never did), and its
	// connections are capped, so that idle ones cannot take the
	// descriptors the other doors need.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Duration(cfg.Server.IdleTimeout)}
	capped := capListener(aln, "admin", adminConnLimits(descriptorLimit()), log)
	go func() { errc <- srv.Serve(capped) }()
	log.Info("admin listening", "addr", aln.Addr().String(), "metrics", "http://"+aln.Addr().String()+"/metrics")
	return srv
}

// serve runs until SIGINT or SIGTERM (a graceful shutdown), a handover
// (SIGUSR2) or a server error, reloading the config on SIGHUP.
func (o *options) serve(ctx context.Context, cfg *sketchproxy.Config, mw *sketchproxy.Middleware, servers []*http.Server, gs *grpc.Server, errc <-chan error, log *slog.Logger) int {
	for {
		select {
		case <-o.hup:
			o.reload(cfg, mw, log, false)
		case <-o.changed:
			o.reload(cfg, mw, log, true)
		case <-o.usr2:
			if o.handover(ctx, mw, log) {
				// No drain: the successor answers on the same sockets, and
				// the health service stays SERVING (a NOT_SERVING here
				// would mark the address down for both).
				return o.stop(servers, gs, log, true)
			}
		case err := <-errc:
			if err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) {
				log.Error("server stopped", "err", err.Error())
				return 1
			}
		case <-ctx.Done():
			o.drain(log)
			return o.stop(servers, gs, log, false)
		}
	}
}

// stop stops accepting on every listener at once, lets what is in flight
// finish within -grace (gRPC connections get a GOAWAY, so that clients
// reconnect, to a successor if there is one), and returns the exit code.
//
// After a handover (handedOver) the HTTP servers first linger, up to a
// second: their listeners close, and each keep-alive connection a gateway
// sends another request on is answered with Connection: close, so that it
// ends after an answer and the gateway opens its next one to the
// successor. Closing a gateway's idle connections at once would race the
// requests it is sending on them: nginx retries one, and answered 502 when
// the connection it retried on was closing too.
func (o *options) stop(servers []*http.Server, gs *grpc.Server, log *slog.Logger, handedOver bool) int {
	log.Info("shutting down", "grace", o.grace.String())
	sctx, cancel := context.WithTimeout(context.Background(), o.grace)
	defer cancel()
	n := len(servers) // what to wait for
	errs := make(chan error, n+1)
	if gs != nil {
		n++
		go func() {
			stopped := make(chan struct{})
			go func() { gs.GracefulStop(); close(stopped) }()
			select {
			case <-stopped:
				errs <- nil
			case <-sctx.Done():
				gs.Stop()
				errs <- sctx.Err()
			}
		}()
	}
	if handedOver {
		o.closing.Store(true)
		for door, ln := range o.listeners {
			if door == "listen" || door == "forward_auth" {
				ln.Close() // the successor accepts on its copy
			}
		}
		for deadline := time.Now().Add(min(o.grace, time.Second)); o.conns.Load() > 0 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		if left := o.conns.Load(); left > 0 {
			log.Info("handover: closing the connections still idle", "connections", left)
		}
	}
	for _, srv := range servers {
		go func() { errs <- srv.Shutdown(sctx) }()
	}
	var err error
	for range n {
		if e := <-errs; e != nil && err == nil {
			err = e
		}
	}
	if err != nil {
		log.Warn("shutdown: requests still running at the grace limit", "err", err.Error())
	}
	log.Info("stopped")
	return 0
}

// reload re-reads the config file (SIGHUP, or the watcher: watched); an
// invalid one is logged and the running config stays. The watcher retries
// a failed reload until the directory is live (watch.go): the same failure
// again is logged at debug level, not once a retry.
func (o *options) reload(cfg *sketchproxy.Config, mw *sketchproxy.Middleware, log *slog.Logger, watched bool) {
	if o.cfgPath == "" {
		log.Info("reload: the demo has no config file")
		return
	}
	var next *sketchproxy.Config
	err := mw.ReloadFrom(func() (*sketchproxy.Config, error) {
		c, err := o.load()
		next = c
		return c, err
	})
	if err != nil {
		if watched && err.Error() == o.lastReloadErr {
			log.Debug("reload failed again: keeping the running config", "err", err.Error())
			return
		}
		o.lastReloadErr = err.Error()
		log.Error("reload failed: keeping the running config", "err", err.Error())
		return
	}
	o.lastReloadErr = ""
	o.current.Store(next)
	for _, w := range next.EnvoyRLS.Warnings() {
		log.Warn("config: " + w)
	}
	if stay := sketchproxy.RestartOnly(cfg, next); len(stay) > 0 { // the fields tagged reload:"restart"
		log.Warn("config reloaded, except settings that take a restart: they keep their running values",
			"rules", len(next.Rules), "restart_for", strings.Join(stay, ", "))
		return
	}
	log.Info("config reloaded", "rules", len(next.Rules))
}

// newReverseProxy proxies to target, keeping the client's Host, setting the
// forwarding headers with forwarded (the Middleware's SetForwarded),
// passing streams (SSE flushes at once) and WebSocket upgrades, and
// answering upstream failures with a 502 problem (408 for a request body
// that passed server.body_timeout).
func newReverseProxy(target *url.URL, silence time.Duration, log *slog.Logger, forwarded func(*httputil.ProxyRequest)) *httputil.ReverseProxy {
	var tr http.RoundTripper = &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: 5 * time.Second,
	}
	if silence > 0 {
		tr = &silenceTransport{next: tr, limit: silence}
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
				if r.ProtoMajor == 1 { // HTTP/2 ends the stream alone; close would GOAWAY the connection
					w.Header().Set("Connection", "close")
				}
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(http.StatusRequestTimeout)
				fmt.Fprintf(w, `{"type":"about:blank","title":"Request Timeout","status":408,"detail":"the request body did not arrive within server.body_timeout"}`+"\n")
				return
			}
			if errors.Is(err, errUpstreamTimeout) {
				log.Warn("upstream timeout", "err", err.Error(), "path", r.URL.Path)
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(http.StatusGatewayTimeout)
				fmt.Fprintf(w, `{"type":"about:blank","title":"Gateway Timeout","status":504,"detail":"the upstream did not answer within server.upstream_timeout"}`+"\n")
				return
			}
			log.Warn("upstream error", "err", err.Error(), "path", r.URL.Path)
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusBadGateway)
			fmt.Fprintf(w, `{"type":"about:blank","title":"Bad Gateway","status":502,"detail":"the upstream did not answer"}`+"\n")
		},
	}
}
