package sketchproxy

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// topLabels runs one Middleware (a process's life) for cfg, sends 20
// requests from 203.0.113.7, over its limit of 5, and returns the key
// labels of the top offenders as /metrics shows them.
func topLabels(t *testing.T, cfg *Config) []string {
	t.Helper()
	mw, err := New(cfg, http.NotFoundHandler(), Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	for range 20 {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "203.0.113.7:4711"
		mw.ServeHTTP(httptest.NewRecorder(), r)
	}
	w := httptest.NewRecorder()
	mw.MetricsHandler().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	var labels []string
	for _, m := range regexp.MustCompile(`sketchproxy_top_offender_level\{key="(k:[0-9a-f]{12})"`).FindAllStringSubmatch(w.Body.String(), -1) {
		labels = append(labels, m[1])
	}
	if len(labels) != 1 {
		t.Fatalf("top offenders' labels %q, want the one client's", labels)
	}
	return labels
}

// With key_label_secret_file a client's label is the same in two
// processes (a restart) and is what docs/metrics.md says to compute: the
// first 12 hex digits of HMAC-SHA256(the trimmed secret, the key), which
// Config.KeyLabel (sketchproxy -key-label) prints. Without it, each start
// draws its own.
func TestKeyLabelsAcrossRestarts(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "label.key")
	os.WriteFile(secret, []byte("  0123456789abcdef0123456789abcdef\n"), 0o600)
	src := "key_label_secret_file: " + secret + "\nrules:\n  - limits: [{requests: 5, per: 10s}]\n"
	cfg, err := ParseConfig("p.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	first, second := topLabels(t, cfg), topLabels(t, cfg)
	mac := hmac.New(sha256.New, []byte("0123456789abcdef0123456789abcdef"))
	mac.Write([]byte("203.0.113.7"))
	want := "k:" + hex.EncodeToString(mac.Sum(nil))[:12]
	if first[0] != want || second[0] != want {
		t.Errorf("labels %s then %s, want %s both times", first[0], second[0], want)
	}
	if got, err := cfg.KeyLabel("203.0.113.7"); err != nil || got != want {
		t.Errorf("KeyLabel: %q %v, want %s", got, err, want)
	}

	plain, err := ParseConfig("p.yaml", []byte("rules:\n  - limits: [{requests: 5, per: 10s}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if a, b := topLabels(t, plain), topLabels(t, plain); a[0] == b[0] {
		t.Errorf("without a secret two starts labelled the client %s both times: want a key drawn at each start", a[0])
	}
	if _, err := plain.KeyLabel("203.0.113.7"); err == nil || !strings.Contains(err.Error(), "key_label_secret_file is not set") {
		t.Errorf("KeyLabel without a secret: %v", err)
	}
}

// IPKey groups an address as the key part "ip" does.
func TestIPKey(t *testing.T) {
	cfg, err := ParseConfig("p.yaml", []byte("client_ip: {ipv4_prefix: 24}\nrules:\n  - limits: [{requests: 1, per: 1s}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string]string{"203.0.113.7": "203.0.113.0/24", "2001:db8::7": "2001:db8::/64", "::ffff:192.0.2.1": "192.0.2.0/24"} {
		if got, err := cfg.IPKey(netip.MustParseAddr(addr)); err != nil || got != want {
			t.Errorf("IPKey(%s) = %q %v, want %s", addr, got, err, want)
		}
	}
}

// A secret file that is missing or too short is an error at load, with
// the field.
func TestKeyLabelSecretErrors(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("tooshort\n"), 0o600)
	for file, want := range map[string]string{
		short:                        "p.yaml:1: key_label_secret_file: the secret is 8 bytes: use at least 16 random bytes",
		filepath.Join(dir, "absent"): "p.yaml:1: key_label_secret_file: open ",
	} {
		_, err := ParseConfig("p.yaml", []byte("key_label_secret_file: "+file+"\nrules:\n  - limits: [{requests: 1, per: 1s}]\n"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", file, err, want)
		}
	}
}
