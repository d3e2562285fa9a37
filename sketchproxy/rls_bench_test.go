package sketchproxy

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// BenchmarkShouldRateLimit is Envoy's rate-limit service's own cost per
// call, in process (no gRPC): two descriptors, one a nested key=value
// pair, of 10,000 clients, every call admitted. response_headers=ratelimit
// and dynamic metadata add the work a response can ask for.
func BenchmarkShouldRateLimit(b *testing.B) {
	for _, extra := range []string{"", "  response_headers: ratelimit\n  response_dynamic_metadata: true\n"} {
		name := "response=plain"
		if extra != "" {
			name = "response=headers+metadata"
		}
		b.Run(name, func(b *testing.B) {
			cfg, err := ParseConfig("b", []byte(`envoy_rls:
  listen: 127.0.0.1:0
`+extra+`  domains:
    - domain: edge
      descriptors:
        - key: remote_address
          rate_limit: {unit: second, requests_per_unit: 1000000}
        - key: path
          value: /api
          descriptors:
            - key: user
              rate_limit: {unit: minute, requests_per_unit: 8000000}
`))
			if err != nil {
				b.Fatal(err)
			}
			mw, err := New(cfg, http.NotFoundHandler(), Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			defer mw.Close()
			s := mw.rlsService()
			reqs := make([]*rlsv3.RateLimitRequest, 10000)
			for i := range reqs {
				c := strconv.Itoa(i)
				reqs[i] = &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{
					{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0." + c}}},
					{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "path", Value: "/api"}, {Key: "user", Value: "u" + c}}},
				}}
			}
			ctx := context.Background()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				resp, err := s.ShouldRateLimit(ctx, reqs[i%len(reqs)])
				if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					b.Fatalf("%v %v", resp, err)
				}
			}
		})
	}
}
