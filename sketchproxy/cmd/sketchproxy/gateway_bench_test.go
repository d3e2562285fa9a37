package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/epochsketch/epochsketch/sketchproxy"
)

const gatewayBenchConfig = `
admin: "off"
client_ip: {trusted_proxies: [127.0.0.1/32]}
forward_auth: {}
envoy_rls:
  listen: "127.0.0.1:0"
  domains:
    - domain: edge
      descriptors:
        - key: remote_address
          rate_limit: {unit: second, requests_per_unit: 1000000}
rules:
  - name: per-client
    limits: [{requests: 1000000, per: 1s}]
`

// gatewayBench is SketchProxy's two gateway interfaces on loopback, in this
// process: the forward-auth check over HTTP/1.1 and Envoy's rate-limit
// service over gRPC, both with limits no client reaches.
type gatewayBench struct {
	mw    *sketchproxy.Middleware
	check string
	http  *http.Client
	rls   rlsv3.RateLimitServiceClient
}

func newGatewayBench(b *testing.B) *gatewayBench {
	cfg, err := sketchproxy.ParseConfig("bench", []byte(gatewayBenchConfig))
	if err != nil {
		b.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	mw, err := sketchproxy.New(cfg, http.NotFoundHandler(), sketchproxy.Options{Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { mw.Close() })
	hs := httptest.NewServer(mw.ForwardAuth())
	b.Cleanup(hs.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	gs := grpc.NewServer()
	mw.RegisterRateLimitService(gs)
	go gs.Serve(ln)
	b.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	tr := &http.Transport{MaxIdleConnsPerHost: 256}
	b.Cleanup(tr.CloseIdleConnections)
	return &gatewayBench{mw: mw, check: hs.URL + "/check", http: &http.Client{Transport: tr}, rls: rlsv3.NewRateLimitServiceClient(conn)}
}

func (g *gatewayBench) forwardAuth(b *testing.B, client string) {
	req, _ := http.NewRequest("GET", g.check, nil)
	req.Header.Set("X-Forwarded-Method", "GET")
	req.Header.Set("X-Forwarded-Uri", "/api/items")
	req.Header.Set("X-Forwarded-For", client)
	resp, err := g.http.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("check: %d", resp.StatusCode)
	}
}

func (g *gatewayBench) shouldRateLimit(b *testing.B, client string) {
	resp, err := g.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
		Domain:      "edge",
		Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: client}}}},
	})
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		b.Fatalf("ShouldRateLimit: %v %v", resp, err)
	}
}

// redisIncrExpire is what envoyproxy/ratelimit sends Redis per descriptor:
// INCRBY and EXPIRE of the window's key, in one pipeline round trip.
func redisIncrExpire(b *testing.B, rdb *redis.Client, client string) {
	ctx := context.Background()
	key := "edge_remote_address_" + client + "_" + strconv.FormatInt(time.Now().Unix(), 10)
	p := rdb.Pipeline()
	p.IncrBy(ctx, key, 1)
	p.Expire(ctx, key, time.Second)
	if _, err := p.Exec(ctx); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkGatewayDecision is one rate-limit decision a gateway asks for,
// on loopback: SketchProxy's forward-auth check (HTTP/1.1 keep-alive),
// its Envoy rate-limit service (gRPC), and, in the same run, the Redis
// round trip envoyproxy/ratelimit pays per descriptor (INCRBY plus EXPIRE
// in one pipeline, to a local redis-server). mode=latency is one caller
// waiting for each answer; mode=throughput is b.RunParallel with 16
// callers per core. 1000 client addresses in turn.
func BenchmarkGatewayDecision(b *testing.B) {
	rs := startRedis(b, 0)
	rdb := redis.NewClient(&redis.Options{Addr: rs.addr(), PoolSize: 64})
	b.Cleanup(func() { rdb.Close() })
	g := newGatewayBench(b)
	clients := make([]string, 1000)
	for i := range clients {
		clients[i] = fmt.Sprintf("10.0.%d.%d", i/256, i%256)
	}
	impls := []struct {
		name string
		do   func(b *testing.B, client string)
	}{
		{"forward-auth", g.forwardAuth},
		{"envoy-rls", g.shouldRateLimit},
		{"redis-incr-expire", func(b *testing.B, c string) { redisIncrExpire(b, rdb, c) }},
	}
	for _, mode := range []string{"latency", "throughput"} {
		for _, im := range impls {
			b.Run("mode="+mode+"/impl="+im.name, func(b *testing.B) {
				b.ReportAllocs()
				if mode == "latency" {
					i := 0
					for b.Loop() {
						im.do(b, clients[i%len(clients)])
						i++
					}
					return
				}
				var next atomic.Int64
				b.SetParallelism(16)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						im.do(b, clients[int(next.Add(1))%len(clients)])
					}
				})
			})
		}
	}
}

// BenchmarkRLSFloodMemory sends n distinct descriptor values (a
// key-rotation flood) and reports the memory it took: for SketchProxy's
// rate-limit service, the live heap after the flood less the live heap
// before it; for the Redis INCRBY and EXPIRE that envoyproxy/ratelimit
// sends per descriptor (one-minute windows), redis-server's used_memory
// after less before.
func BenchmarkRLSFloodMemory(b *testing.B) {
	for _, n := range []int{10_000, 1_000_000} {
		b.Run(fmt.Sprintf("impl=envoy-rls/distinct=%d", n), func(b *testing.B) {
			for b.Loop() {
				g := newGatewayBench(b)
				g.shouldRateLimit(b, "warm")
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				for i := range n {
					g.shouldRateLimit(b, "flood-"+strconv.Itoa(i))
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/(1<<20), "live-MiB")
			}
		})
		b.Run(fmt.Sprintf("impl=redis-incr-expire/distinct=%d", n), func(b *testing.B) {
			for b.Loop() {
				rs := startRedis(b, 0)
				rdb := redis.NewClient(&redis.Options{Addr: rs.addr()})
				ctx := context.Background()
				used := func() int64 {
					v, err := rdb.InfoMap(ctx, "memory").Result()
					if err != nil {
						b.Fatal(err)
					}
					n, _ := strconv.ParseInt(v["Memory"]["used_memory"], 10, 64)
					return n
				}
				before := used()
				window := strconv.FormatInt(time.Now().Unix()/60, 10)
				for i := 0; i < n; i += 1000 {
					p := rdb.Pipeline()
					for j := i; j < min(i+1000, n); j++ {
						key := "edge_remote_address_flood-" + strconv.Itoa(j) + "_" + window
						p.IncrBy(ctx, key, 1)
						p.Expire(ctx, key, time.Minute)
					}
					if _, err := p.Exec(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(used()-before)/(1<<20), "redis-MiB")
				rdb.Close()
				rs.kill()
			}
		})
	}
}
