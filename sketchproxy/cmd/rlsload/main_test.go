package main

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// fakeRLS allows each value `limit` calls, then answers OVER_LIMIT; value
// "fail" gets a gRPC error. Until loaded is set it answers without a limit,
// as a service whose domain file is not read yet.
type fakeRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	limit int

	mu     sync.Mutex
	loaded bool
	calls  map[string]int
}

func (f *fakeRLS) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	v := req.GetDescriptors()[0].GetEntries()[0].GetValue()
	if v == "fail" {
		return nil, status.Error(codes.Unavailable, "down")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.loaded {
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{}}}, nil
	}
	f.calls[v]++
	code := rlsv3.RateLimitResponse_OK
	if f.calls[v] > f.limit {
		code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return &rlsv3.RateLimitResponse{OverallCode: code, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
		Code: code, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: uint32(f.limit), Unit: rlsv3.RateLimitResponse_RateLimit_SECOND},
	}}}, nil
}

func serve(t *testing.T, f *fakeRLS) []rlsv3.RateLimitServiceClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(s, f)
	go s.Serve(ln)
	t.Cleanup(s.Stop)
	var clients []rlsv3.RateLimitServiceClient
	for range 2 {
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		clients = append(clients, rlsv3.NewRateLimitServiceClient(conn))
	}
	return clients
}

func TestRunCountsEveryCall(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values int
	}{{"values=1", 1}, {"values=7", 7}} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeRLS{limit: 5, loaded: true, calls: map[string]int{}}
			clients := serve(t, f)
			l := load{Domain: "api", Key: "api_key", Values: tc.values, Duration: 300 * time.Millisecond, Concurrency: 4, Timeout: 5 * time.Second}
			r := run(context.Background(), clients, l)
			f.mu.Lock()
			defer f.mu.Unlock()
			served := 0
			for _, n := range f.calls {
				served += n
			}
			if r.Calls != served || r.Errors != 0 || r.Calls != r.OK+r.Over {
				t.Fatalf("%+v; the service served %d", r, served)
			}
			if len(f.calls) != tc.values {
				t.Errorf("%d distinct values reached the service, want %d: %v", len(f.calls), tc.values, f.calls)
			}
			// Values are handed out in turn: no value gets ahead of another
			// by more than the calls in flight.
			lo, hi := r.Calls, 0
			for _, n := range f.calls {
				lo, hi = min(lo, n), max(hi, n)
			}
			if hi-lo > l.Concurrency {
				t.Errorf("values reached unevenly: %v", f.calls)
			}
			if want := tc.values * f.limit; r.Calls > want && r.OK != want {
				t.Errorf("ok %d, want %d (each value's first %d)", r.OK, want, f.limit)
			}
			if r.P50 <= 0 || r.P99 < r.P50 {
				t.Errorf("p50 %v p99 %v", r.P50, r.P99)
			}
		})
	}
}

func TestRunCountsErrorsApart(t *testing.T) {
	f := &fakeRLS{limit: 5, loaded: true, calls: map[string]int{}}
	l := load{Domain: "api", Key: "api_key", Values: 1, Duration: 100 * time.Millisecond, Concurrency: 2, Timeout: 5 * time.Second}
	reqs := l.requests()
	reqs[0].Descriptors[0].Entries[0].Value = "fail"
	// The same load with its one value failing: every call an error, none
	// timed.
	r := runRequests(context.Background(), serve(t, f), l, reqs)
	if r.Calls == 0 || r.Errors != r.Calls || r.OK+r.Over != 0 || r.FirstError == nil || r.P50 != 0 {
		t.Fatalf("%+v", r)
	}
}

func TestReadyWaitsForTheLimit(t *testing.T) {
	f := &fakeRLS{limit: 5, calls: map[string]int{}}
	clients := serve(t, f)
	l := load{Domain: "api", Key: "api_key"}
	if err := ready(context.Background(), clients[0], l, 300*time.Millisecond); err == nil {
		t.Fatal("ready before the domain was loaded")
	}
	f.mu.Lock()
	f.loaded = true
	f.mu.Unlock()
	if err := ready(context.Background(), clients[0], l, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestQuantile(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 100; i++ {
		s = append(s, time.Duration(i))
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 50}, {0.99, 99}, {1, 100}, {0, 1}} {
		if got := quantile(s, tc.q); got != tc.want {
			t.Errorf("q=%v: %v, want %v", tc.q, got, tc.want)
		}
	}
	if quantile(nil, 0.5) != 0 {
		t.Error("empty")
	}
}
