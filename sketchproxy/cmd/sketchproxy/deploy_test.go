package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// runCmd runs the binary to its end and returns its streams and status.
func runCmd(t *testing.T, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	if err := cmd.Run(); err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatal(err)
		}
		code = ee.ExitCode()
	}
	return o.String(), e.String(), code
}

// -example minimal is a config of about ten lines that checks clean and,
// with only its upstream changed, limits every client: the first 100 or so
// requests (the burst) pass, then 429. A flood of refusals is logged as one
// line for the rule's first refusal of each interval and one line counting
// the rest, and the lines add up to every refusal.
func TestBinaryExampleMinimal(t *testing.T) {
	bin := build(t)
	minimal, errs, code := runCmd(t, bin, "-example", "minimal")
	if code != 0 || errs != "" {
		t.Fatalf("-example minimal: exit %d %s", code, errs)
	}
	if n := strings.Count(minimal, "\n"); n > 15 {
		t.Errorf("-example minimal has %d lines, want about 10:\n%s", n, minimal)
	}
	for _, want := range []string{"listen:", "upstream:", "trusted_proxies:", "key: [ip]", "limits:"} {
		if !strings.Contains(minimal, want) {
			t.Errorf("-example minimal lacks %s:\n%s", want, minimal)
		}
	}
	if again, _, _ := runCmd(t, bin, "-example=minimal"); again != minimal {
		t.Errorf("-example=minimal differs from -example minimal")
	}
	cfg := filepath.Join(t.TempDir(), "proxy.yaml")
	os.WriteFile(cfg, []byte(minimal), 0o644)
	if out, errs, code := runCmd(t, bin, "-config", cfg, "-check"); code != 0 || errs != "" || !strings.Contains(out, "ok, 1 rule\n") {
		t.Errorf("-check on -example minimal: exit %d %q %q", code, out, errs)
	}

	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "app\n") }))
	defer up.Close()
	cmd, out := start(t, bin, "-config", cfg, "-upstream", up.URL, "-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0", "-refusal-log-every", "1s")
	addr := "http://" + waitFor(t, out, regexp.MustCompile(`msg="sketchproxy listening" addr=(\S+)`))[1] + "/"
	began := time.Now()
	passed, refused := 0, 0
	for range 600 {
		resp, err := http.Get(addr)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case 200:
			passed++
		case 429:
			refused++
		default:
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	took := time.Since(began)
	if passed < 100 || refused < 300 {
		t.Fatalf("600 requests from one client: %d passed, %d refused; want the burst of 100 or more, then refusals", passed, refused)
	}
	// Every refusal is on a line: the first of each interval whole, the
	// others counted on the interval's closing line (at most 1 s later).
	logged := func() (whole, counted int) {
		s := out.String()
		whole = strings.Count(s, `msg="sketchproxy decision" rule=per-ip`)
		for _, m := range regexp.MustCompile(`msg="sketchproxy refusals" rule=per-ip shadow=false more_refusals=(\d+)`).FindAllStringSubmatch(s, -1) {
			n, _ := strconv.Atoi(m[1])
			counted += n
		}
		return whole, counted
	}
	deadline := time.Now().Add(15 * time.Second)
	for whole, counted := logged(); whole+counted != refused; whole, counted = logged() {
		if time.Now().After(deadline) {
			t.Fatalf("%d refusals, %d logged whole and %d counted:\n%s", refused, whole, counted, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if whole, _ := logged(); whole > int(took/time.Second)+2 {
		t.Errorf("%d refusals in %v logged whole on %d lines: want one per rule per second", refused, took.Round(time.Millisecond), whole)
	}
	cmd.Process.Signal(os.Interrupt)
	cmd.Wait()
}

// -check warns, on standard error and still with exit 0, about a rule
// that can never refuse (shadow) and trusted-proxy ranges of a /8 or wider
// (IPv6: a /32 or wider); a narrow range and a single address are fine.
// A start logs the same warnings.
func TestBinaryCheckWarnings(t *testing.T) {
	bin := build(t)
	dir := t.TempDir()
	full, _, _ := runCmd(t, bin, "-example")
	fullPath := filepath.Join(dir, "full.yaml")
	os.WriteFile(fullPath, []byte(full), 0o644)
	out, errs, code := runCmd(t, bin, "-config", fullPath, "-check")
	if code != 0 || !strings.Contains(out, "ok, 3 rules (2 warnings on standard error)") ||
		!strings.Contains(errs, "warning: rules[2] (per-ip): shadow: true: it decides, logs and counts, but never refuses a request") ||
		!strings.Contains(errs, "warning: client_ip.trusted_proxies[1]: 10.0.0.0/8 trusts every host in it") {
		t.Errorf("-check on -example: exit %d\n%s\n%s", code, out, errs)
	}
	wide := filepath.Join(dir, "wide.yaml")
	os.WriteFile(wide, []byte(`upstream: "http://127.0.0.1:9000"
client_ip:
  trusted_proxies: ["0.0.0.0/0", "10.1.2.0/24", "192.0.2.7", "::/0", "2001:db8::/48"]
rules:
  - name: per-ip
    key: [ip]
    limits: [{requests: 5, per: 1s}]
`), 0o644)
	out, errs, code = runCmd(t, bin, "-config", wide, "-check")
	if code != 0 || !strings.Contains(out, "(2 warnings") || !strings.Contains(errs, "trusted_proxies[0]: 0.0.0.0/0") || !strings.Contains(errs, "trusted_proxies[3]: ::/0") {
		t.Errorf("wide ranges: exit %d\n%s\n%s", code, out, errs)
	}
	up := httptest.NewServer(http.NotFoundHandler())
	defer up.Close()
	cmd, log := start(t, bin, "-config", wide, "-upstream", up.URL, "-listen", "127.0.0.1:0", "-admin", "off")
	waitFor(t, log, regexp.MustCompile(`level=WARN msg="config: client_ip.trusted_proxies\[0\]: 0.0.0.0/0`))
	cmd.Process.Signal(os.Interrupt)
	cmd.Wait()
}
