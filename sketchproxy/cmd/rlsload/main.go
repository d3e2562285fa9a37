// Command rlsload drives one Envoy rate-limit service (SketchProxy's
// envoy_rls or envoyproxy/ratelimit) with ShouldRateLimit calls for a fixed
// time, as Envoy's ratelimit filter would, and prints one line of results:
//
//	calls=N calls_per_s=X ok_per_s=X p50_us=X p99_us=X ok=N over_limit=N errors=N
//
// Each call carries one descriptor, key=value; -values 1 sends one hot value,
// -values N cycles through N distinct ones. Before the load it waits until
// the service answers with a limit for the descriptor (its domain file is
// loaded); -duration 0 only waits. scripts/rls-compare.sh runs it against both services
// (docs/LIMITERS.md, "Beside envoyproxy/ratelimit").
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// load is one run's shape.
type load struct {
	Domain      string
	Key         string
	Values      int // 1: the value "hot"; more: "v0" ... cycled
	Duration    time.Duration
	Concurrency int
	Timeout     time.Duration // per call
}

// result is what one run measured.
type result struct {
	Calls, OK, Over, Errors int
	Elapsed                 time.Duration
	P50, P99                time.Duration // over the calls that returned
	FirstError              error
}

func (r result) String() string {
	s := r.Elapsed.Seconds()
	return fmt.Sprintf("calls=%d calls_per_s=%.0f ok_per_s=%.0f p50_us=%d p99_us=%d ok=%d over_limit=%d errors=%d",
		r.Calls, float64(r.Calls)/s, float64(r.OK)/s, r.P50.Microseconds(), r.P99.Microseconds(), r.OK, r.Over, r.Errors)
}

// requests builds every request once, so the client's own allocations stay
// out of the timed loop as far as gRPC allows.
func (l load) requests() []*rlsv3.RateLimitRequest {
	values := []string{"hot"}
	if l.Values > 1 {
		values = make([]string, l.Values)
		for i := range values {
			values[i] = "v" + strconv.Itoa(i)
		}
	}
	reqs := make([]*rlsv3.RateLimitRequest, len(values))
	for i, v := range values {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: l.Domain, Descriptors: []*rlv3.RateLimitDescriptor{{
			Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: l.Key, Value: v}},
		}}}
	}
	return reqs
}

// run sends l's calls from l.Concurrency goroutines, worker i on
// clients[i%len(clients)], until l.Duration has passed or ctx is done.
func run(ctx context.Context, clients []rlsv3.RateLimitServiceClient, l load) result {
	return runRequests(ctx, clients, l, l.requests())
}

// runRequests is run with the requests given, handed out in turn.
func runRequests(ctx context.Context, clients []rlsv3.RateLimitServiceClient, l load, reqs []*rlsv3.RateLimitRequest) result {
	var next atomic.Uint64
	type worker struct {
		lat            []time.Duration
		ok, over, errs int
		firstErr       error
	}
	workers := make([]worker, l.Concurrency)
	ctx, cancel := context.WithTimeout(ctx, l.Duration)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range workers {
		w, client := &workers[i], clients[i%len(clients)]
		w.lat = make([]time.Duration, 0, 1<<16)
		wg.Go(func() {
			for ctx.Err() == nil {
				req := reqs[(next.Add(1)-1)%uint64(len(reqs))]
				cctx, ccancel := context.WithTimeout(context.Background(), l.Timeout)
				t0 := time.Now()
				resp, err := client.ShouldRateLimit(cctx, req)
				d := time.Since(t0)
				ccancel()
				switch {
				case err != nil:
					w.errs++
					if w.firstErr == nil {
						w.firstErr = err
					}
					continue
				case resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
					w.over++
				default:
					w.ok++
				}
				w.lat = append(w.lat, d)
			}
		})
	}
	wg.Wait()
	r := result{Elapsed: time.Since(start)}
	var lat []time.Duration
	for _, w := range workers {
		r.OK, r.Over, r.Errors = r.OK+w.ok, r.Over+w.over, r.Errors+w.errs
		if r.FirstError == nil {
			r.FirstError = w.firstErr
		}
		lat = append(lat, w.lat...)
	}
	r.Calls = r.OK + r.Over + r.Errors
	slices.Sort(lat)
	r.P50, r.P99 = quantile(lat, 0.50), quantile(lat, 0.99)
	return r
}

// quantile is the nearest-rank q-quantile of sorted (0 when empty).
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// ready calls until the service answers with a limit for a descriptor of
// the load's key (its domain file is loaded), or wait has passed.
func ready(ctx context.Context, client rlsv3.RateLimitServiceClient, l load, wait time.Duration) error {
	req := &rlsv3.RateLimitRequest{Domain: l.Domain, Descriptors: []*rlv3.RateLimitDescriptor{{
		Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: l.Key, Value: "rlsload-ready"}},
	}}}
	deadline := time.Now().Add(wait)
	var last error
	for time.Now().Before(deadline) {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := client.ShouldRateLimit(cctx, req)
		cancel()
		switch {
		case err != nil:
			last = err
		case len(resp.GetStatuses()) != 1 || resp.GetStatuses()[0].GetCurrentLimit() == nil:
			last = fmt.Errorf("no limit for %s=... in domain %q yet: %v", l.Key, l.Domain, resp)
		default:
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("the service did not answer with a limit within %v: %w", wait, last)
}

func main() {
	addr := flag.String("addr", "", "the service's gRPC address, host:port (required)")
	var l load
	flag.StringVar(&l.Domain, "domain", "api", "the descriptor's domain")
	flag.StringVar(&l.Key, "key", "api_key", "the descriptor entry's key")
	flag.IntVar(&l.Values, "values", 1, `distinct values: 1 sends "hot", N cycles through "v0" ... "v<N-1>"`)
	flag.DurationVar(&l.Duration, "duration", 10*time.Second, "how long to send calls (0: only wait until the service is ready)")
	flag.IntVar(&l.Concurrency, "concurrency", 16, "calls in flight")
	flag.DurationVar(&l.Timeout, "timeout", 5*time.Second, "each call's deadline")
	conns := flag.Int("conns", 2, "gRPC connections (HTTP/2), shared by the callers")
	wait := flag.Duration("wait", 60*time.Second, "how long to wait for the service to answer with a limit first")
	flag.Parse()
	if err := check(*addr, l, *conns); err != nil {
		fmt.Fprintln(os.Stderr, "rlsload:", err)
		os.Exit(2)
	}
	clients := make([]rlsv3.RateLimitServiceClient, *conns)
	for i := range clients {
		conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			fmt.Fprintf(os.Stderr, "rlsload: -addr %s: %v\n", *addr, err)
			os.Exit(2)
		}
		defer conn.Close()
		clients[i] = rlsv3.NewRateLimitServiceClient(conn)
	}
	ctx := context.Background()
	if err := ready(ctx, clients[0], l, *wait); err != nil {
		fmt.Fprintf(os.Stderr, "rlsload: %s: %v\n", *addr, err)
		os.Exit(1)
	}
	if l.Duration == 0 {
		return
	}
	r := run(ctx, clients, l)
	fmt.Println(r)
	if r.FirstError != nil {
		fmt.Fprintf(os.Stderr, "rlsload: %d of %d calls failed; the first: %v\n", r.Errors, r.Calls, r.FirstError)
	}
	if r.Errors == r.Calls {
		os.Exit(1)
	}
}

// check says what is wrong with the flags, and what to do.
func check(addr string, l load, conns int) error {
	switch {
	case addr == "":
		return errors.New("-addr is required: the service's gRPC address, e.g. -addr 127.0.0.1:8081")
	case l.Values < 1:
		return fmt.Errorf("-values %d: want 1 (one hot value) or more", l.Values)
	case l.Duration < 0 || l.Timeout <= 0:
		return errors.New("-duration must be 0 or more and -timeout positive, e.g. -duration 10s")
	case l.Concurrency < 1 || conns < 1:
		return errors.New("-concurrency and -conns must be at least 1")
	}
	return nil
}
