package caddyepochsketch

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/epochsketch/epochsketch"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestExampleScript runs sketchproxy/examples/caddy-module/run.sh as a user
// would (with the binary the tests built): its one open line, a burst, the
// stacked /api/ zone's RateLimit fields beside per_ip's, requests that
// SketchProxy's proxy would refuse passed on as sent, and SIGINT, after
// which nothing answers on its port and its directory is gone.
func TestExampleScript(t *testing.T) {
	bin := caddyBinary(t)
	tmp := t.TempDir()
	cmd := exec.Command("bash", filepath.Join("..", "examples", "caddy-module", "run.sh"))
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp, "EPOCHSKETCH_CADDY="+bin)
	out := new(lockedBuffer)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	re := regexp.MustCompile(`(?m)^open (http://(127\.0\.0\.1:\d+)/)$`)
	var url, hostPort string
	for deadline := time.Now().Add(2 * time.Minute); url == ""; {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			url, hostPort = m[1], m[2]
			break
		}
		select {
		case err := <-done:
			t.Fatalf("run.sh stopped (%v) before printing its open line:\n%s", err, out)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("run.sh printed no open line:\n%s", out)
		}
	}
	if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) != 1 {
		t.Errorf("run.sh printed more than the open line:\n%s", out)
	}

	// per_ip: 5 per 10 s, so its counts halve every 5 s; each try is a
	// new client address, from the start of a tick.
	const tick = 5 * time.Second
	var codes []string
	var last answer
	for try := 0; try < 3; try++ {
		end := awayFromTickEdge(tick, 3*time.Second)
		c := clientFrom(fmt.Sprintf("127.0.1.%d", 10+try))
		codes = codes[:0]
		for range 7 {
			last = get(t, c, url)
			codes = append(codes, fmt.Sprint(last.code))
		}
		if time.Now().Before(end) {
			break
		}
	}
	if got := strings.Join(codes, " "); got != "200 200 200 200 200 429 429" {
		t.Fatalf("a burst of 7 from one address: %s", got)
	}
	if last.retryAfter == "" || !strings.Contains(last.rateLimit, ";r=0;t=") {
		t.Errorf("the 429: Retry-After %q, RateLimit %q", last.retryAfter, last.rateLimit)
	}

	// /api/ passes both zones: both policies on every answer; a refusal by
	// per_ip lists per_ip alone in RateLimit (the policy it is over). The
	// zones are one decision: the API key's quota spends nothing on the
	// request per_ip refuses, so after 5 admitted, 1 refused and 1
	// admitted from another address, 94 of its 100 are left. (Written as
	// two directives, Caddy ran the one with a matcher first, and the
	// refusal cost the key one more: 93.) A 5 s tick of per_ip holds the
	// whole try, and so one 30 s tick of api_keys.
	var after answer
	for try := 0; try < 3; try++ {
		end := awayFromTickEdge(tick, 3*time.Second)
		c := clientFrom(fmt.Sprintf("127.0.2.%d", 10+try))
		key := fmt.Sprintf("k%d", try)
		codes = codes[:0]
		var first answer
		for i := range 6 {
			last = get(t, c, url+"api/items?page=2", "X-API-Key", key)
			if i == 0 {
				first = last
			}
			codes = append(codes, fmt.Sprint(last.code))
		}
		after = get(t, clientFrom(fmt.Sprintf("127.0.2.%d", 20+try)), url+"api/items", "X-API-Key", key)
		if time.Now().Before(end) {
			for _, f := range []string{first.policy, first.rateLimit} {
				if !strings.Contains(f, `"per_ip-`) || !strings.Contains(f, `"api_keys-`) {
					t.Errorf("an admitted /api/ request's field %q: want both zones' policies", f)
				}
			}
			break
		}
	}
	if got := strings.Join(codes, " "); got != "200 200 200 200 200 429" {
		t.Fatalf("6 /api/ requests from one address: %s", got)
	}
	if !strings.Contains(last.policy, `"per_ip-`) || !strings.Contains(last.policy, `"api_keys-`) ||
		!strings.Contains(last.rateLimit, `"per_ip-`) || strings.Contains(last.rateLimit, `"api_keys-`) {
		t.Errorf("the /api/ refusal: RateLimit-Policy %q, RateLimit %q: want both policies, and per_ip alone in RateLimit", last.policy, last.rateLimit)
	}
	if after.code != 200 || !strings.Contains(after.rateLimit, `"api_keys-per-1m";r=94;`) {
		t.Errorf("the key from another address after 5 admitted and 1 refused: %d, RateLimit %q; want 200 with api_keys at r=94", after.code, after.rateLimit)
	}

	// No check that no zone asked for: an encoded slash, TRACE and a
	// lower-case method are judged by per_ip and reach the app as sent.
	c := clientFrom("127.0.3.1")
	for _, tc := range []struct{ method, path, want string }{
		{"GET", "a%2Fb", "(GET /a/b)"},
		{"TRACE", "", "(TRACE /)"},
		{"get", "x", "(get /x)"},
	} {
		a := send(t, c, tc.method, url+tc.path)
		if a.code != 200 || !strings.Contains(a.body, tc.want) || !strings.Contains(a.rateLimit, `"per_ip-`) {
			t.Errorf("%s /%s: %d %q, RateLimit %q; want the app's answer %s, judged by per_ip", tc.method, tc.path, a.code, a.body, a.rateLimit, tc.want)
		}
	}

	syscall.Kill(cmd.Process.Pid, syscall.SIGINT)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("run.sh did not stop on SIGINT:\n%s", out)
	}
	if c, err := net.DialTimeout("tcp", hostPort, time.Second); err == nil {
		c.Close()
		t.Errorf("Caddy still answers on %s after SIGINT", hostPort)
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, "*")); len(left) > 0 {
		t.Errorf("run.sh left %v behind", left)
	}
}

// The example's per_ip zone counts an IPv6 client by its /64, one
// subscriber's network: six addresses of one /64 get per_ip's 5 and no
// more. Keyed by {remote_host}, as it was, each of them (of 2^64) had a
// limit of its own (issue 46).
func TestExampleCaddyfileIPv6(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "examples", "caddy-module", "Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	block := string(src[bytes.Index(src, []byte("epochsketch {")):])
	for i, depth := 0, 0; i < len(block); i++ { // up to its closing brace
		if block[i] == '{' {
			depth++
		} else if block[i] == '}' {
			if depth--; depth == 0 {
				block = block[:i+1]
			}
		}
	}
	tokens, err := caddyfile.Tokenize([]byte(block), "Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	seg := caddyfile.Segment(tokens)
	httpcaddyfile.NewShorthandReplacer().ApplyToSegment(&seg) // {remote_host}, as the adapter reads it
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewDispenser(seg)); err != nil {
		t.Fatalf("%v\n%s", err, block)
	}
	newConfig(t, epochsketch.NewManualClock(t0)).provision(&h)
	var codes []string
	for i := range 6 {
		ip := fmt.Sprintf("2001:db8::%x", i+1)
		r := request("/")
		r.RemoteAddr = "[" + ip + "]:1234"
		caddyhttp.SetVar(r.Context(), caddyhttp.ClientIPVarKey, ip)
		codes = append(codes, fmt.Sprint(serve([]*Handler{&h}, r).Code))
	}
	if got := strings.Join(codes, " "); got != "200 200 200 200 200 429" {
		t.Errorf("6 addresses of one /64 through the example's zones: %s, want per_ip's 5 for the /64", got)
	}
}

// Every whole Caddyfile in README.md (a site block, or global options
// and sites) loads in the built Caddy: `caddy validate` adapts it and
// provisions every module, ours included.
func TestReadmeCaddyfiles(t *testing.T) {
	bin := caddyBinary(t)
	src, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```caddyfile\n(.*?)```").FindAllStringSubmatch(string(src), -1)
	n := 0
	for _, b := range blocks {
		conf := b[1]
		if strings.HasPrefix(conf, "epochsketch ") || strings.HasPrefix(conf, "@") {
			continue // the syntax, and a fragment
		}
		n++
		dir := t.TempDir()
		// validate provisions the handlers: the fleet example's files
		// are read, so they must be there.
		var paths []string
		for _, name := range []string{"/etc/caddy/fleet-secret", "/run/secrets/redis-password"} {
			f := filepath.Join(dir, filepath.Base(name))
			os.WriteFile(f, []byte("a-per-deployment-secret-of-16-bytes-or-more\n"), 0o600)
			paths = append(paths, name, f)
		}
		conf = strings.NewReplacer(paths...).Replace(conf)
		file := filepath.Join(dir, "Caddyfile")
		os.WriteFile(file, []byte(conf), 0o600)
		cmd := exec.Command(bin, "validate", "--config", file, "--adapter", "caddyfile")
		cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("README's Caddyfile %d does not load: %v\n%s\n%s", n, err, conf, out)
		}
	}
	if n < 5 {
		t.Errorf("%d whole Caddyfiles in README.md, want the 5 examples", n)
	}
}
