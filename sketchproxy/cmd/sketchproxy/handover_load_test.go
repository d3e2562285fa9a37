package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// sendVia sends a request for path through the gateway at base, from client
// (its X-Forwarded-For), with a body if a POST, and returns the status.
func sendVia(base, method, path, client string) (int, error) {
	var body io.Reader
	if method == "POST" {
		body = strings.NewReader("a body")
	}
	req, _ := http.NewRequest(method, base+path, body)
	req.Header.Set("X-Forwarded-For", client)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// hotFive is the hot client's five GETs of /hot/x through the gateway at
// base: their statuses, spaced.
func hotFive(t *testing.T, base string) string {
	t.Helper()
	var got []string
	for range 5 {
		code, err := sendVia(base, "GET", "/hot/x", "198.51.100.9")
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, strconv.Itoa(code))
	}
	return strings.Join(got, " ")
}

// mixedLoad is the restart tests' load, about 200 requests a second in
// all (8 workers, one each 40 ms), each from a client of its own (under
// every limit): a quarter of the workers call Envoy's service with rls at
// the given deadline, a quarter POST and the rest GET through the gateway
// at base (nginx retries a POST only where it may).
type mixedLoad struct {
	http, grpc *restartLoad
	done       chan struct{}
	wg         sync.WaitGroup
}

func startMixedLoad(base string, rls rlsv3.RateLimitServiceClient, deadline time.Duration) *mixedLoad {
	m := &mixedLoad{http: &restartLoad{statuses: map[int]int{}}, grpc: &restartLoad{statuses: map[int]int{}}, done: make(chan struct{})}
	var seq atomic.Int64
	const workers, every = 8, 40 * time.Millisecond
	for w := range workers {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			tick := time.NewTicker(every)
			defer tick.Stop()
			for {
				select {
				case <-m.done:
					return
				case <-tick.C:
				}
				n := seq.Add(1)
				began := time.Now()
				if w%4 == 3 {
					ctx, cancel := context.WithTimeout(context.Background(), deadline)
					_, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("user", strconv.FormatInt(n, 10))}})
					cancel()
					m.grpc.record(200, err, began)
					continue
				}
				method := "GET"
				if w%4 == 1 {
					method = "POST"
				}
				code, err := sendVia(base, method, "/", fmt.Sprintf("10.%d.%d.%d", n>>16&255, n>>8&255, n&255))
				m.http.record(code, err, began)
			}
		}()
	}
	return m
}

// stop ends the load and waits for its requests to end.
func (m *mixedLoad) stop() {
	close(m.done)
	m.wg.Wait()
}

// waitLoad waits until l has made n requests (30 s at most: a stalled load
// fails t).
func waitLoad(t *testing.T, l *restartLoad, n int64) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); l.n.Load() < n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the load stalled at %d requests", l.n.Load())
		}
	}
}

// A handover without a state_file (the minimal config, and systemd's
// ExecReload) hands the counts over all the same: a client refused on a
// route of 3 a minute stays refused in the successor, which needs no
// warm-up either. The state travels in a file no other process can open,
// gone before the successor starts.
func TestBinaryHandoverKeepsCountsWithoutStateFile(t *testing.T) {
	bin := build(t)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer app.Close()
	cfg := filepath.Join(t.TempDir(), "sp.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("listen: \"127.0.0.1:0\"\nadmin: \"off\"\nupstream: %q\nrules:\n  - name: slow\n    limits: [{requests: 3, per: 1m}]\n", app.URL)), 0o644)
	tmp := t.TempDir() // the handover's private directory goes here
	cmd := exec.Command(bin, "-config", cfg)
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	out := startLogged(t, cmd)
	base := "http://" + waitFor(t, out, regexp.MustCompile(`msg="sketchproxy listening" addr=(\S+)`))[1]
	// 3 a minute is a tick of 30 s: four requests and a handover, far
	// from its edge, see no halving.
	awayFromTickEdge(30*time.Second, 10*time.Second)
	codes := func(n int) string {
		var got []string
		for range n {
			code, err := sendVia(base, "GET", "/", "198.51.100.3")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, strconv.Itoa(code))
		}
		return strings.Join(got, " ")
	}
	if got := codes(4); got != "200 200 200 429" {
		t.Fatalf("before the handover: %s, want 200 200 200 429", got)
	}
	cmd.Process.Signal(syscall.SIGUSR2)
	next, _ := strconv.Atoi(waitFor(t, out, regexp.MustCompile(`msg="handover: the successor serves; stopping to accept" successor_pid=(\d+)`))[1])
	t.Cleanup(func() { syscall.Kill(next, syscall.SIGKILL) })
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the old process: %v\n%s", err, out)
	}
	if got := codes(2); got != "429 429" {
		t.Errorf("after the handover: %s, want 429 429: the successor started with empty counts\n%s", got, out)
	}
	if !strings.Contains(out.String(), `msg="state restored" file="(handed over by the predecessor)"`) {
		t.Errorf("the successor did not say it restored the handed-over state:\n%s", out)
	}
	if left, _ := os.ReadDir(tmp); len(left) > 0 {
		t.Errorf("the handover left %s in the temporary directory", left[0].Name())
	}
	syscall.Kill(next, syscall.SIGTERM)
}

// A stop whose last save fails (the state file's directory gone since the
// start) logs it at ERROR and exits 1: the counts since the last save are
// lost, and the service manager hears of it.
func TestBinaryStopFailedSaveExits1(t *testing.T) {
	bin := build(t)
	dir := filepath.Join(t.TempDir(), "state")
	os.Mkdir(dir, 0o700)
	cfg := filepath.Join(t.TempDir(), "sp.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("listen: \"127.0.0.1:0\"\nadmin: \"off\"\nupstream: \"http://127.0.0.1:1\"\nstate_file: %q\nrules:\n  - limits: [{requests: 3, per: 1m}]\n", filepath.Join(dir, "state"))), 0o644)
	cmd := exec.Command(bin, "-config", cfg)
	out := startLogged(t, cmd)
	waitFor(t, out, regexp.MustCompile(`msg="sketchproxy listening"`))
	os.RemoveAll(dir)
	cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Errorf("exit: %v, want status 1\n%s", err, out)
	}
	if !strings.Contains(out.String(), `level=ERROR msg="state save at shutdown failed"`) {
		t.Errorf("no ERROR for the failed save:\n%s", out)
	}
}
