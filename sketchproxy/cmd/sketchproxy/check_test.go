package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy"
)

// -check warns of the forward_auth settings docs/forward-auth.md's gateway table
// calls broken or unsafe: a refusal status other than 401 or 403 behind
// nginx (auth_request turns it into 500), behind Traefik a client address
// read from Forwarded (the client's own) or X-Real-Ip (Traefik's), and
// behind nginx and Caddy one read from Forwarded or X-Real-IP, which they
// pass on from the client unless their config replaces them.
// The repository's gateway examples, the safe settings, get none.
func TestGatewayWarnings(t *testing.T) {
	const rule = "rules:\n  - limits: [{requests: 1, per: 1s}]\n"
	for _, c := range []struct {
		name, src, want string
	}{
		{"nginx, 429 by default", "client_ip: {trusted_proxies: [127.0.0.1]}\nforward_auth: {gateway: nginx}\n" + rule,
			"forward_auth.refusal_status: 429 with gateway nginx: auth_request accepts only 2xx, 401 and 403"},
		{"nginx, 429 written", "client_ip: {trusted_proxies: [127.0.0.1]}\nforward_auth: {gateway: nginx, refusal_status: 429}\n" + rule,
			"set refusal_status: 403"},
		{"nginx, 403", "client_ip: {trusted_proxies: [127.0.0.1]}\nforward_auth: {gateway: nginx, refusal_status: 403}\n" + rule, ""},
		{"nginx, 401", "client_ip: {trusted_proxies: [127.0.0.1]}\nforward_auth: {gateway: nginx, refusal_status: 401}\n" + rule, ""},
		{"caddy, 429", "client_ip: {trusted_proxies: [127.0.0.1]}\nforward_auth: {gateway: caddy}\n" + rule, ""},
		{"traefik, forwarded", "client_ip: {trusted_proxies: [127.0.0.1], source: forwarded}\nforward_auth: {gateway: traefik}\n" + rule,
			"client_ip.source: forwarded with gateway traefik: Traefik passes a client's own Forwarded header to the check, so each client chooses its key"},
		{"traefik, x-real-ip", "client_ip: {trusted_proxies: [127.0.0.1], source: X-Real-IP}\nforward_auth: {gateway: traefik}\n" + rule,
			"client_ip.source: x-real-ip with gateway traefik: X-Real-Ip names Traefik, not the client, so every client shares one key"},
		{"caddy, forwarded", "client_ip: {trusted_proxies: [127.0.0.1], source: forwarded}\nforward_auth: {gateway: caddy}\n" + rule,
			"client_ip.source: forwarded with gateway caddy: Caddy passes a client's own Forwarded header to the check unless the forward_auth block's header_up replaces it"},
		{"caddy, x-real-ip", "client_ip: {trusted_proxies: [127.0.0.1], source: x-real-ip}\nforward_auth: {gateway: caddy}\n" + rule,
			"client_ip.source: x-real-ip with gateway caddy: Caddy passes a client's own X-Real-IP header"},
		{"nginx, x-real-ip", "client_ip: {trusted_proxies: [127.0.0.1], source: x-real-ip}\nforward_auth: {gateway: nginx, refusal_status: 403}\n" + rule,
			"client_ip.source: x-real-ip with gateway nginx: nginx passes a client's own X-Real-IP header to the check unless the auth location's proxy_set_header replaces it"},
		{"caddy, a header of its own", "client_ip: {trusted_proxies: [127.0.0.1], source: \"header:CF-Connecting-IP\"}\nforward_auth: {gateway: caddy}\n" + rule, ""},
		{"traefik, x-forwarded-for", "client_ip: {trusted_proxies: [127.0.0.1]}\nforward_auth: {gateway: traefik}\n" + rule, ""},
		{"no gateway named", "client_ip: {trusted_proxies: [127.0.0.1], source: forwarded}\nforward_auth: {}\n" + rule, ""},
		{"no forward_auth", "client_ip: {source: forwarded}\n" + rule, ""},
	} {
		cfg, err := sketchproxy.ParseConfig("p.yaml", []byte(c.src))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		ws := gatewayWarnings(cfg)
		switch {
		case c.want == "" && len(ws) > 0:
			t.Errorf("%s: warned %q", c.name, ws)
		case c.want != "" && (len(ws) != 1 || !strings.Contains(ws[0], c.want)):
			t.Errorf("%s: warnings %q, want one containing %q", c.name, ws, c.want)
		}
	}
	for _, ex := range []string{"nginx", "caddy", "traefik"} {
		cfg, err := sketchproxy.LoadConfig("../../examples/" + ex + "/sketchproxy.yaml")
		if err != nil {
			t.Fatal(err)
		}
		if ws := gatewayWarnings(cfg); len(ws) > 0 || cfg.ForwardAuth == nil || cfg.ForwardAuth.Gateway != ex {
			t.Errorf("examples/%s/sketchproxy.yaml: gateway %v, warnings %q", ex, cfg.ForwardAuth, ws)
		}
	}
}

// -key-label prints the label of a key under the config's
// key_label_secret_file, first as the ip key part groups a client address;
// without the secret it fails and says what to set.
func TestKeyLabelFlag(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "label.key")
	os.WriteFile(secret, []byte("0123456789abcdef0123456789abcdef\n"), 0o600)
	with := filepath.Join(dir, "with.yaml")
	os.WriteFile(with, []byte("upstream: \"http://127.0.0.1:1\"\nkey_label_secret_file: "+secret+"\nrules:\n  - limits: [{requests: 1, per: 1s}]\n"), 0o600)
	without := filepath.Join(dir, "without.yaml")
	os.WriteFile(without, []byte("upstream: \"http://127.0.0.1:1\"\nrules:\n  - limits: [{requests: 1, per: 1s}]\n"), 0o600)
	// The labels printf '%s' KEY | openssl dgst -sha256 -hmac SECRET gives
	// (docs/metrics.md), its first 12 hex digits.
	for value, want := range map[string]string{
		"203.0.113.7": "k:55a7c9ba39c7 203.0.113.7\n",
		"2001:db8::7": "k:d8702f872354 2001:db8::/64\nk:84e100c1f060 2001:db8::7\n",
	} {
		var out, errb bytes.Buffer
		if code := run([]string{"-config", with, "-key-label", value}, &out, &errb); code != 0 || out.String() != want {
			t.Errorf("-key-label %s: exit %d, %q %q; want %q", value, code, out.String(), errb.String(), want)
		}
	}
	var errb bytes.Buffer
	if code := run([]string{"-config", without, "-key-label", "203.0.113.7"}, io.Discard, &errb); code != 1 || !strings.Contains(errb.String(), "key_label_secret_file is not set") {
		t.Errorf("-key-label without a secret: exit %d, %q", code, errb.String())
	}
}

// -check, and a start, refuse a state_file that no save could write,
// saying what and where: a directory, a file in a directory that does not
// exist, a file where no file can be created (/proc, even for root).
func TestCheckRefusesUnwritableStateFile(t *testing.T) {
	bin := build(t)
	dir := t.TempDir()
	for _, c := range []struct{ name, state, want string }{
		{"a directory", dir, "state_file " + dir + ": is a directory"},
		{"no directory", filepath.Join(dir, "nope", "state"), "its directory " + filepath.Join(dir, "nope") + " does not exist"},
		{"read-only", "/proc/sketchproxy-state", "cannot create files in /proc"},
		{"writable", filepath.Join(dir, "state"), ""},
	} {
		cfg := filepath.Join(dir, "sp.yaml")
		os.WriteFile(cfg, []byte(fmt.Sprintf("upstream: \"http://127.0.0.1:1\"\nstate_file: %q\nrules:\n  - limits: [{requests: 1, per: 1s}]\n", c.state)), 0o600)
		var errb bytes.Buffer
		code := run([]string{"-config", cfg, "-check"}, io.Discard, &errb)
		switch {
		case c.want == "" && code != 0:
			t.Errorf("%s: -check: exit %d, %s", c.name, code, errb.String())
		case c.want != "" && (code != 1 || !strings.Contains(errb.String(), c.want)):
			t.Errorf("%s: -check: exit %d, %q; want 1 and %q", c.name, code, errb.String(), c.want)
		}
		if c.want == "" {
			continue // a start would serve
		}
		// The binary, under a deadline: one that starts serves on.
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		out, err := exec.CommandContext(ctx, bin, "-config", cfg, "-listen", "127.0.0.1:0", "-admin", "off").CombinedOutput()
		cancel()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), c.want) {
			t.Errorf("%s: a start: %v, %q; want exit 1 and %q", c.name, err, out, c.want)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".state.check-*")); len(left) > 0 {
		t.Errorf("-check left %v", left)
	}
}

// -check says what is wrong with a fleet's secret file (its path and how
// many bytes it holds, at its line) and warns when min_replicas is set
// beside replicas, which fixes N.
func TestCheckFleetSecretAndReplicas(t *testing.T) {
	dir := t.TempDir()
	short, good := filepath.Join(dir, "short"), filepath.Join(dir, "good")
	os.WriteFile(short, []byte("short\n"), 0o600)
	os.WriteFile(good, []byte("0123456789abcdef0123456789abcdef\n"), 0o600)
	for _, c := range []struct {
		name, secret, extra, want string
		code                      int
	}{
		{"short secret file", short, "  min_replicas: 2\n", "sp.yaml:6: fleet.secret_file: " + short + " holds 5 bytes", 1},
		{"replicas and min_replicas", good, "  replicas: 2\n  min_replicas: 3\n", "fleet.min_replicas: 3 is ignored: replicas: 2 fixes N", 0},
	} {
		cfg := filepath.Join(dir, "sp.yaml")
		os.WriteFile(cfg, []byte(fmt.Sprintf("upstream: \"http://127.0.0.1:1\"\nrules:\n  - limits: [{requests: 1, per: 1s}]\nfleet:\n  redis: \"127.0.0.1:1\"\n  secret_file: %q\n%s", c.secret, c.extra)), 0o600)
		var errb bytes.Buffer
		if code := run([]string{"-config", cfg, "-check"}, io.Discard, &errb); code != c.code || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%s: -check: exit %d, %q; want %d and %q", c.name, code, errb.String(), c.code, c.want)
		}
	}
}
