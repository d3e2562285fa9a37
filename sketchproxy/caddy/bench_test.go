package caddyepochsketch

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkCaddyLatency is one client's requests, one at a time over one
// keep-alive connection, through the built Caddy answering with respond:
// plain, with the epochsketch module, and with forward_auth asking the
// sketchproxy binary (the hop the module saves). Every request measured is
// under the limits; before measuring, a probe zone (1 an hour on /probe)
// answers 429 with the RateLimit field, so the limiter runs in that
// config, and each answer the module measured must carry the field. Compare with
// benchstat:
//
//	go test -run XXX -bench CaddyLatency -count 6 . | tee /tmp/caddy.txt
//	go run golang.org/x/perf/cmd/benchstat@latest -col /door /tmp/caddy.txt
func BenchmarkCaddyLatency(b *testing.B) {
	for _, door := range []struct{ name, handler string }{
		{"plain", ""},
		{"epochsketch", `epochsketch {
		zone per_ip {
			key {remote_host}
			events 1000000
			window 1s
		}
		zone probe {
			key {remote_host}
			events 1
			window 1h
			match {
				path /probe
			}
		}
	}`},
		{"forward_auth", `forward_auth {{UPSTREAM}} {
		uri /check
		copy_headers RateLimit RateLimit-Policy
	}`},
	} {
		b.Run("door="+door.name, func(b *testing.B) {
			check := ""
			if door.name == "forward_auth" {
				check = startCheck(b)
			}
			site := "http://127.0.0.1:{{PORT}} {\n\troute {\n\t" + door.handler + "\n\t\trespond \"ok\"\n\t}\n}\n"
			s := startCaddy(b, site, check)
			c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			url := s.url("/bench?q=1")
			limited := door.name != "plain"
			if limited {
				var last *http.Response
				for range 2 {
					resp, err := c.Get(s.url("/probe"))
					if err != nil {
						b.Fatal(err)
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					last = resp
				}
				if last.StatusCode != http.StatusTooManyRequests || !strings.Contains(last.Header.Get("RateLimit"), `"probe-`) {
					b.Fatalf("%s: /probe twice at 1 an hour: %d, RateLimit %q; want 429 with the field", door.name, last.StatusCode, last.Header.Get("RateLimit"))
				}
			}
			get := func() {
				resp, err := c.Get(url)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				// forward_auth's copy_headers gives the fields to the
				// request, not the answer: only the module's must carry them.
				if resp.StatusCode != 200 || door.name == "epochsketch" && resp.Header.Get("RateLimit") == "" {
					b.Fatalf("%s: %d, RateLimit %q", door.name, resp.StatusCode, resp.Header.Get("RateLimit"))
				}
			}
			get() // the connection is open
			b.ResetTimer()
			for b.Loop() {
				get()
			}
		})
	}
}

var (
	checkOnce sync.Once
	checkBin  string
	checkErr  error
)

// startCheck builds and starts the sketchproxy binary as Caddy's
// forward_auth check (the caddy example's config with a limit no
// benchmark reaches) and returns its host:port.
func startCheck(b *testing.B) string {
	dir := b.TempDir()
	checkOnce.Do(func() {
		checkBin = filepath.Join(filepath.Dir(caddyBinary(b)), "sketchproxy")
		if out, err := exec.Command("go", "build", "-C", "..", "-o", checkBin, "./cmd/sketchproxy").CombinedOutput(); err != nil {
			checkErr = fmt.Errorf("go build sketchproxy: %v\n%s", err, out)
		}
	})
	if checkErr != nil {
		b.Fatal(checkErr)
	}
	bin := checkBin
	cfg := filepath.Join(dir, "sketchproxy.yaml")
	os.WriteFile(cfg, []byte(`client_ip:
  trusted_proxies: [127.0.0.1/32]
forward_auth:
  gateway: caddy
rules:
  - name: per-client
    limits: [{requests: 1000000, per: 1s}]
  - name: probe
    match: {path_prefix: /probe}
    limits: [{requests: 1, per: 1h}]
`), 0o600)
	cmd := exec.Command(bin, "-config", cfg, "-listen", "127.0.0.1:0", "-admin", "off")
	out, err := cmd.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stdout = cmd.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	re := regexp.MustCompile(`msg="forward_auth listening" addr=(\S+)`)
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			}
		}
	}()
	select {
	case addr := <-found:
		return addr
	case <-time.After(30 * time.Second):
		b.Fatal("sketchproxy's check did not start")
		return ""
	}
}
