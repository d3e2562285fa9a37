package caddyepochsketch

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"golang.org/x/crypto/bcrypt"

	"github.com/epochsketch/epochsketch"
)

// validateFails runs "caddy validate" on the Caddyfile conf (its
// {{PORT}} and {{UPSTREAM}} filled) and returns its output; the test
// fails if Caddy accepts it.
func validateFails(t *testing.T, conf string) string {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "Caddyfile")
	conf = strings.NewReplacer("{{PORT}}", "1", "{{UPSTREAM}}", "127.0.0.1:1").Replace(conf)
	if err := os.WriteFile(path, []byte("{\n\tadmin off\n\tauto_https off\n}\n"+conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(caddyBinary(t), "validate", "--config", path, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("caddy validate accepted:\n%s", conf)
	}
	return string(out)
}

// authApp is a forward_auth service: 200 with X-User: alice for the
// token "alice", 401 otherwise.
func authApp(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer alice" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("X-User", "alice")
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// userZone is a directive with one zone of 3 an hour keyed by key.
func userZone(key string) string { return zoneOf1("per_user", key, 3) }

// zoneOf1 is a directive with one zone, name, of events an hour by key.
func zoneOf1(name, key string, events int) string {
	return fmt.Sprintf("epochsketch {\n\t\tzone %s {\n\t\t\tkey %s\n\t\t\tevents %d\n\t\t\twindow 1h\n\t\t}\n\t}", name, key, events)
}

// TestCaddyAuthOrder: a zone keyed by what authentication sets
// ({http.auth.user.id} from basic_auth, a header forward_auth copies) is
// refused at provision where the directive runs before that
// authentication (its default place, before basic_auth), saying how to
// write it; written after it, in a route block or with "order epochsketch
// after forward_auth", it counts each user apart, and a client's own
// X-User is not its key. Issue 46: before, alice's 3 requests and bob's
// shared one count "-", and 6 of 6 requests with X-User spoof$i passed.
func TestCaddyAuthOrder(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	basic := "basic_auth {\n\t\talice " + string(hash) + "\n\t\tbob " + string(hash) + "\n\t}"
	forward := "forward_auth {{UPSTREAM}} {\n\t\turi /auth\n\t\tcopy_headers X-User\n\t}"

	for _, tc := range []struct{ name, site, want string }{
		{"basic_auth", "http://127.0.0.1:{{PORT}} {\n\t" + userZone("{http.auth.user.id}") + "\n\t" + basic + "\n\trespond ok\n}\n",
			"write the zone after the authentication in a route block"},
		{"forward_auth", "http://127.0.0.1:{{PORT}} {\n\t" + userZone("{header.X-User}") + "\n\t" + forward + "\n\trespond ok\n}\n",
			"the client's own X-User would be read"},
		{"forward_auth-in-handle", "http://127.0.0.1:{{PORT}} {\n\t" + userZone("{header.X-User}") + "\n\thandle /api/* {\n\t" + forward + "\n\trespond ok\n\t}\n}\n",
			"forward_auth copies from its answer"},
	} {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			if out := validateFails(t, tc.site); !strings.Contains(out, tc.want) || !strings.Contains(out, "order epochsketch after forward_auth") {
				t.Fatalf("caddy validate said:\n%s\nwant %q and the order to write", out, tc.want)
			}
		})
	}

	t.Run("basic_auth-in-route", func(t *testing.T) {
		// A limit by address before basic_auth (password guessing stops
		// at 429), one by user after it.
		site := "http://127.0.0.1:{{PORT}} {\n\troute {\n\t" + zoneOf1("per_ip", "{remote_host}", 6) +
			"\n\t" + basic + "\n\t" + userZone("{http.auth.user.id}") + "\n\trespond ok\n\t}\n}\n"
		s := startCaddy(t, site, "")
		offTheEdge(t)
		do := func(c *http.Client, user string) int {
			req, _ := http.NewRequest(http.MethodGet, s.url("/"), nil)
			req.SetBasicAuth(user, "pw")
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}
		c := clientFrom("127.0.2.1")
		var codes []string
		for range 4 {
			codes = append(codes, fmt.Sprint(do(c, "alice")))
		}
		codes = append(codes, fmt.Sprint(do(c, "bob")))
		if got, want := strings.Join(codes, " "), "200 200 200 429 200"; got != want {
			t.Errorf("alice x4, then bob: %s, want %s (a count per user)", got, want)
		}
		codes = nil
		g := clientFrom("127.0.2.2")
		for range 7 {
			codes = append(codes, fmt.Sprint(do(g, "mallory")))
		}
		if got, want := strings.Join(codes, " "), "401 401 401 401 401 401 429"; got != want {
			t.Errorf("password guessing: %s, want %s (the limit by address runs before basic_auth)", got, want)
		}
	})

	t.Run("forward_auth-ordered-after", func(t *testing.T) {
		site := "http://127.0.0.1:{{PORT}} {\n\t" + userZone("{header.X-User}") + "\n\t" + forward + "\n\trespond ok\n}\n"
		s := startCaddy(t, site, authApp(t), "\torder epochsketch after forward_auth")
		offTheEdge(t)
		c := clientFrom("127.0.2.3")
		admitted := 0
		for i := range 6 {
			if a := get(t, c, s.url("/"), "Authorization", "Bearer alice", "X-User", fmt.Sprintf("spoof%d", i)); a.code == 200 {
				admitted++
			} else if a.code != 429 {
				t.Fatalf("request %d: %d, want 200 or 429", i+1, a.code)
			}
		}
		if admitted != 3 {
			t.Errorf("alice with X-User spoof$i: %d of 6 admitted, want 3 (the key is what forward_auth copied)", admitted)
		}
	})
}

// TestUnknownPlaceholder: a key with a placeholder Caddy has no value for
// ({remote_ip}, a shorthand in JSON) is refused, saying what to write;
// Caddy's own, those handlers set, and other modules' are accepted.
// Before, {remote_ip} made the whole site one count.
func TestUnknownPlaceholder(t *testing.T) {
	for _, tc := range []struct{ key, want string }{
		{"{remote_ip}", "Caddy has no placeholder {remote_ip}"},
		{"{http.request.remote_ip}", "Caddy has no placeholder {http.request.remote_ip}"},
		{"{remote_host}", "in JSON write {http.request.remote.host}"},
		{"{http.request.remote.host}", ""},
		{"{http.request.header.X-API-Key}|{http.request.uri.query.k}", ""},
		{"{http.auth.user.id}", ""},
		{"{http.vars.client_ip}", ""},
		{"{http.epochsketch.client_prefix}", ""},
		{"{env.TENANT}-{geoip2.country_code}", ""},
		{"{section}", ""}, // a map directive's output
		{"{client_addr}", "Caddy has no placeholder {client_addr}"},
	} {
		t.Run(tc.key, func(t *testing.T) {
			h := Handler{Zones: map[string]*Zone{"a": {Key: tc.key, Events: 5, Window: 1e9}}}
			err := h.Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Validate: %v, want %q", err, tc.want)
			}
		})
	}
}

// TestKeySpellingsCaddy: as SketchProxy's proxy (TestKeySpellings), the
// module counts the spellings an application reads as one credential
// under one key: the Authorization scheme in any case, with extra spaces;
// a query key as PHP reads it and before a ';'.
func TestKeySpellingsCaddy(t *testing.T) {
	c := newConfig(t, epochsketch.NewManualClock(t0))
	h := c.provision(&Handler{Zones: map[string]*Zone{
		"a": {Key: "{http.request.header.Authorization}", Events: 1, Window: caddy.Duration(time.Hour)},
		"q": {Key: "{http.request.uri.query.api_key}", Events: 1, Window: caddy.Duration(time.Hour)},
	}})
	first := request("/?api_key=zed")
	first.Header.Set("Authorization", "Bearer abc")
	if w := serve([]*Handler{h}, first); w.Code != http.StatusOK {
		t.Fatalf("first: %d", w.Code)
	}
	for _, tc := range []struct{ auth, target string }{
		{"bearer abc", "/?api_key=other1"},
		{"BEARER abc", "/?api_key=other2"},
		{"Bearer  abc", "/?api_key=other3"},
		{"Bearer new1", "/?api.key=zed"},
		{"Bearer new2", "/?api%20key=zed"},
		{"Bearer new3", "/?api_key=zed;x=1"},
	} {
		r := request(tc.target)
		r.Header.Set("Authorization", tc.auth)
		if w := serve([]*Handler{h}, r); w.Code != http.StatusTooManyRequests {
			t.Errorf("%q %s: %d, want 429 (a key already counted)", tc.auth, tc.target, w.Code)
		}
	}
}
