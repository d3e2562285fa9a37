package caddyepochsketch

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/epochsketch/epochsketch"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	in := `epochsketch {
		zone per_ip {
			key {http.request.remote.host}
			events 5
			window 10s
		}
		zone api_keys {
			key {http.request.header.X-API-Key}
			events 100
			window 1m
			burst 20
			match {
				path /api/*
				method POST
			}
			shared
		}
		sketch_buckets 4096
		new_keys off
		jitter 0.2
		log_key
	}`
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(in)); err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(&h)
	want := `{"zones":{"api_keys":{"key":"{http.request.header.X-API-Key}","events":100,"window":60000000000,"burst":20,"shared":true,` +
		`"match":[{"method":["POST"],"path":["/api/*"]}]},` +
		`"per_ip":{"key":"{http.request.remote.host}","events":5,"window":10000000000}},"sketch_buckets":4096,"new_keys_off":true,"jitter":0.2,"log_key":true}`
	if string(got) != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if err := h.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

// Every mistake names the zone and subdirective at fault and says what to
// write instead.
func TestCaddyfileErrors(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"unknown subdirective", `epochsketch { zones x }`, `unrecognized subdirective "zones": want zone, sketch_buckets, new_keys, jitter, log_key or fleet`},
		{"argument on the directive", `epochsketch 5 { }`, `epochsketch takes a matcher and a block, not "5"`},
		{"zone without name", `epochsketch { zone { key x } }`, `zone: want a name, e.g. zone per_ip`},
		{"zone twice", "epochsketch {\nzone a {\nkey x\nevents 1\nwindow 1s\n}\nzone a {\nkey y\n}\n}", `zone a is defined twice in this directive`},
		{"bad events", `epochsketch { zone a { key x
			events many } }`, `zone a: events "many": want a positive number of requests, e.g. events 100`},
		{"zero events", `epochsketch { zone a { key x
			events 0 } }`, `zone a: events "0": want a positive number`},
		{"bad window", `epochsketch { zone a { key x
			window soon } }`, `zone a: window "soon": want a positive duration, e.g. window 10s`},
		{"unknown zone field", `epochsketch { zone a { rate 5 } }`, `zone a: unrecognized subdirective "rate": want key, events, window, burst, match or shared`},
		{"value missing", "epochsketch {\nzone a {\nkey\n}\n}", `zone a: key: want a value, e.g. key {remote_host}`},
		{"two values", "epochsketch {\nzone a {\nkey {remote_host} {path}\n}\n}", `zone a: key: one value only, not also "{path}" (quote a key with spaces)`},
		{"shared with a value", "epochsketch {\nzone a {\nshared yes\n}\n}", `zone a: shared takes no value`},
		{"bad matcher", "epochsketch {\nzone a {\nmatch {\nnosuch x\n}\n}\n}", `zone a: match: `},
		{"bad buckets", `epochsketch { sketch_buckets lots }`, `sketch_buckets "lots": want a number of 64-byte buckets from 1 to 67108864 (4 GiB), e.g. sketch_buckets 65536`},
		{"too many buckets", `epochsketch { sketch_buckets 67108865 }`, `sketch_buckets "67108865": want a number of 64-byte buckets from 1 to 67108864`},
		// Found at the zone's closing brace, reported at its name's line.
		{"no window", "epochsketch {\n\tzone a {\n\t\tkey {remote_host}\n\t\tevents 5\n\t}\n}", `zone a: window is missing: set the period of events, e.g. window 1m, at Testfile:2`},
		{"no events", "epochsketch {\n\tzone a {\n\t\tkey {remote_host}\n\t\twindow 1m\n\t}\n}", `zone a: events is missing: set how many requests a key may make per window, e.g. events 100, at Testfile:2`},
		{"no key", "epochsketch {\n\tzone a {\n\t\tevents 5\n\t\twindow 1m\n\t}\n}", `zone a: key is missing: set one, e.g. key {remote_host}, at Testfile:2`},
		{"bad key", "epochsketch {\n\tzone a {\n\t\tkey {remote_host\n\t\tevents 5\n\t\twindow 1m\n\t}\n}", `zone a: key "{remote_host": a { without its }: write placeholders whole, e.g. {http.request.header.X-API-Key}, at Testfile:2`},
		{"bad burst", "epochsketch {\n\tzone a {\n\t\tkey {remote_host}\n\t\tevents 1000000\n\t\twindow 1s\n\t\tburst 1\n\t}\n}", `zone a: burst: 1e+06 per 1s with a burst of 1 needs a tick of 619ns, under 1ms: raise the burst to at least 1488, at Testfile:2`},
		{"bad name", "epochsketch {\n\tzone a.b {\n\t\tkey {remote_host}\n\t}\n}", `zone "a.b": name: use 1 to 64 letters, digits, - and _, e.g. zone per_ip, at Testfile:2`},
		{"no zones", "epochsketch {\n}", "no zones: add at least one with a key, events and a window, e.g.\n\tzone per_ip {\n\t\tkey {remote_host}\n\t\tevents 5\n\t\twindow 10s\n\t}, at Testfile:1"},
		{"two names", "epochsketch {\n\tzone a b {\n\t}\n}", "zone a: one name, then a block:\n\tzone a {\n\t\tkey {remote_host}"},
		{"new_keys on", `epochsketch { new_keys on }`, `new_keys "on": the one setting is new_keys off`},
		{"jitter too big", `epochsketch { jitter 2 }`, `jitter "2": want a fraction from 0 to 1`},
		{"log_key value", `epochsketch { log_key yes }`, `log_key takes no value`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h Handler
			err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    Handler
		want string
	}{
		{"no zones", Handler{}, "no zones: add at least one"},
		{"no key", Handler{Zones: map[string]*Zone{"a": {Events: 1, Window: 1e9}}}, `zone "a": key is missing: set one, e.g. "key": "{http.epochsketch.client_prefix}"`},
		{"bad key", Handler{Zones: map[string]*Zone{"a": {Key: "{remote_host", Events: 1, Window: 1e9}}}, `zone "a": key "{remote_host": a { without its }`},
		{"no events", Handler{Zones: map[string]*Zone{"a": {Key: "{remote_host}", Window: 1e9}}}, `zone "a": events is missing: set how many requests a key may make per window`},
		{"no window", Handler{Zones: map[string]*Zone{"a": {Key: "{remote_host}", Events: 5}}}, `zone "a": window is missing: set the period of events, e.g. window 1m`},
		{"negative window", Handler{Zones: map[string]*Zone{"a": {Key: "{remote_host}", Events: 5, Window: -1}}}, `zone "a": window -1ns: want a positive duration`},
		{"empty zone", Handler{Zones: map[string]*Zone{"a": nil}}, `zone "a" is empty`},
		{"bad name", Handler{Zones: map[string]*Zone{"bad name!": {Key: "{remote_host}", Events: 5, Window: 1e9}}}, `zone "bad name!": name: use 1 to 64 letters, digits, - and _`},
		{"burst too big", Handler{Zones: map[string]*Zone{"a": {Key: "{remote_host}", Events: 5, Window: 1e9, Burst: 1 << 30}}}, `zone "a": burst: 1.073741824e+09: want 1 to 133152 (or 0: the same as events)`},
		{"tick too short", Handler{Zones: map[string]*Zone{"a": {Key: "{remote_host}", Events: 1e6, Window: 1e9, Burst: 1}}}, `zone "a": burst: 1e+06 per 1s with a burst of 1 needs a tick of 619ns, under 1ms: raise the burst to at least 1488`},
		{"jitter", Handler{Zones: map[string]*Zone{"a": {Key: "{remote_host}", Events: 5, Window: 1e9}}, Jitter: -1}, `jitter -1: want a fraction from 0 to 1`},
		{"buckets", Handler{Zones: map[string]*Zone{"a": {Key: "{remote_host}", Events: 5, Window: 1e9}}, SketchBuckets: 1 << 27}, `sketch_buckets 134217728: want a number of 64-byte buckets from 1 to 67108864`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.h.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "epochsketch: ") {
				t.Fatalf("got %v, want an epochsketch: error with %q", err, tc.want)
			}
		})
	}
}

// Validate's errors are those of a JSON config (a Caddyfile's directive
// reports its own first): every placeholder one suggests works in JSON,
// where {remote_host} and {client_ip}, the Caddyfile's shorthands, are
// refused (TestUnknownPlaceholder).
func TestValidateSuggestsJSON(t *testing.T) {
	suggested := regexp.MustCompile(`\{[A-Za-z0-9_.-]+\}`)
	for _, h := range []Handler{
		{},
		{Zones: map[string]*Zone{"a": {Events: 1, Window: 1e9}}},
		{Zones: map[string]*Zone{"a": {Key: "{http.request.header.X-Key", Events: 1, Window: 1e9}}},
		{Zones: map[string]*Zone{"a": {Key: "{remote_ip}", Events: 1, Window: 1e9}}},
	} {
		err := h.Validate()
		if err == nil {
			t.Fatalf("%+v: Validate accepted it", h.Zones["a"])
		}
		msg := err.Error()
		if z := h.Zones["a"]; z != nil && z.Key != "" {
			msg = strings.ReplaceAll(msg, z.Key, "") // the key as given
		}
		for _, p := range suggested.FindAllString(msg, -1) {
			if why := knownPlaceholder(p[1 : len(p)-1]); why != "" {
				t.Errorf("%q suggests %s: %s", err, p, why)
			}
		}
	}
}

// The JSON form the README shows.
func TestJSONForm(t *testing.T) {
	var h Handler
	in := `{"handler": "epochsketch", "zones": {"per_ip": {"key": "{http.request.remote.host}", "events": 5, "window": "10s", "match": [{"path": ["/api/*"]}]}}}`
	if err := json.Unmarshal([]byte(in), &h); err != nil {
		t.Fatal(err)
	}
	if z := h.Zones["per_ip"]; z == nil || z.Key != "{http.request.remote.host}" || z.Events != 5 || time.Duration(z.Window) != 10*time.Second || len(z.MatcherSetsRaw) != 1 {
		t.Fatalf("read %+v", h.Zones["per_ip"])
	}
	if err := h.Validate(); err != nil {
		t.Error(err)
	}
}

// README.md's JSON form reads into the handler, every field known, and
// validates.
func TestReadmeJSON(t *testing.T) {
	src, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```json\n(.*?)```").FindStringSubmatch(string(src))
	if m == nil {
		t.Fatal("README.md has no JSON form")
	}
	var h Handler
	dec := json.NewDecoder(strings.NewReader(strings.Replace(m[1], `"handler": "epochsketch",`, "", 1)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		t.Fatal(err)
	}
	if err := h.Validate(); err != nil || len(h.Zones) != 2 || !h.Zones["api_keys"].Shared || h.Jitter != 0.2 {
		t.Errorf("%v: %+v", err, h)
	}
}

// README.md's sketch_buckets figure is the library's sizing rule: the
// default 65536 buckets hold 131,072 heavy hitters.
func TestReadmeSizing(t *testing.T) {
	if n := epochsketch.BucketsFor(131_072); n != 65_536 || n != (&Handler{}).buckets() {
		t.Errorf("epochsketch.BucketsFor(131072) = %d, the default sketch_buckets %d: README.md says both are 65536", n, (&Handler{}).buckets())
	}
	src, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(src), "room for 131,072 keys") || !strings.Contains(string(src), "`epochsketch.BucketsFor(131072)` is 65536") {
		t.Error("README.md no longer gives the sizing figure this test checks")
	}
}

// A fleet block reads every FleetConfig setting under its own name, into
// the JSON form's names.
func TestCaddyfileFleet(t *testing.T) {
	in := `epochsketch {
		zone per_ip {
			key {http.request.remote.host}
			events 5
			window 10s
		}
		fleet {
			redis rediss://caddy@redis.internal:6380/2
			username caddy
			password_file /run/secrets/redis-password
			tls {
				ca_file /etc/caddy/redis-ca.pem
				cert_file /etc/caddy/client.pem
				key_file /etc/caddy/client.key
				server_name redis.internal
			}
			secret_file /etc/caddy/fleet-secret
			replicas 3
			id caddy-a
			interval 200ms
			timeout 100ms
			promote_fraction 0.25
			max_hot 5000
			prefix "edge:"
		}
	}`
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(in)); err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(h.Fleet)
	want := `{"redis":"rediss://caddy@redis.internal:6380/2","username":"caddy","password_file":"/run/secrets/redis-password",` +
		`"tls":{"ca_file":"/etc/caddy/redis-ca.pem","cert_file":"/etc/caddy/client.pem","key_file":"/etc/caddy/client.key","server_name":"redis.internal"},` +
		`"secret_file":"/etc/caddy/fleet-secret","replicas":3,"id":"caddy-a","interval":200000000,"timeout":100000000,` +
		`"promote_fraction":0.25,"max_hot":5000,"prefix":"edge:"}`
	if string(got) != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if p, d := h.Fleet.config().Prefix, (&Fleet{}).config().Prefix; p != "edge:" || d != "epochsketch:" {
		t.Errorf("prefix %q, default %q; want edge: and epochsketch: (apart from SketchProxy's replicas)", p, d)
	}
	// The files are read when the fleet starts, not when the Caddyfile
	// is adapted or validated.
	if err := h.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	for _, tc := range []struct{ in, want string }{
		{"cluster 10.0.0.11:6379 10.0.0.12:6379\nsecret a-secret-of-16-bytes-at-least", `{"cluster":["10.0.0.11:6379","10.0.0.12:6379"],"secret":"a-secret-of-16-bytes-at-least"}`},
		{"sentinel mymaster 10.0.0.21:26379 10.0.0.22:26379 {\npassword_env SENTINEL_PASSWORD\n}\npassword s3cret\ndb 1\nsecret a-secret-of-16-bytes-at-least",
			`{"sentinel":{"master":"mymaster","addrs":["10.0.0.21:26379","10.0.0.22:26379"],"password_env":"SENTINEL_PASSWORD"},"password":"s3cret","db":1,"secret":"a-secret-of-16-bytes-at-least"}`},
		{"redis 127.0.0.1:6379\ntls\nsecret a-secret-of-16-bytes-at-least\npassword_env REDIS_PASSWORD", `{"redis":"127.0.0.1:6379","password_env":"REDIS_PASSWORD","tls":{},"secret":"a-secret-of-16-bytes-at-least"}`},
	} {
		var h Handler
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("epochsketch {\nzone a {\nkey {remote_host}\nevents 1\nwindow 1s\n}\nfleet {\n" + tc.in + "\n}\n}")); err != nil {
			t.Errorf("%q: %v", tc.in, err)
			continue
		}
		if got, _ := json.Marshal(h.Fleet); string(got) != tc.want {
			t.Errorf("%q:\ngot  %s\nwant %s", tc.in, got, tc.want)
		}
	}
}

// A fleet block's mistakes are reported at the line of the setting at
// fault; those SketchProxy's checks find, in SketchProxy's words (the
// field, as sketchproxy.yaml names it, and its message).
func TestCaddyfileFleetErrors(t *testing.T) {
	const zone = "epochsketch {\n\tzone a {\n\t\tkey {remote_host}\n\t\tevents 5\n\t\twindow 1m\n\t}\n\tfleet {\n" // the fleet is at line 7
	const secret = "\t\tsecret a-secret-of-16-bytes-at-least\n"
	for _, tc := range []struct{ name, in, want string }{
		{"no redis", secret, "fleet: say where Redis is with exactly one of redis (host:port or a redis:// URL), cluster (seed nodes) or sentinel, at Testfile:7"},
		{"two places", "\t\tredis 127.0.0.1:6379\n\t\tcluster 127.0.0.1:7000\n" + secret, "fleet: say where Redis is with exactly one of redis"},
		{"short secret", "\t\tredis 127.0.0.1:6379\n\t\tsecret short\n", "fleet.secret: a per-deployment secret of at least 16 bytes is required (secret or secret_file): keys are hashed with it before they reach Redis, at Testfile:9"},
		{"no secret", "\t\tredis 127.0.0.1:6379\n", "fleet.secret: a per-deployment secret of at least 16 bytes is required"},
		{"secret twice", "\t\tredis 127.0.0.1:6379\n" + secret + "\t\tsecret_file /x\n", "fleet: give secret or secret_file, not both, at Testfile:7"},
		{"bad redis", "\t\tredis localhost\n" + secret, `fleet.redis: "localhost": want host:port or a redis:// URL, at Testfile:8`},
		{"bad url", "\t\tredis redis://[::1\n" + secret, "fleet.redis: "},
		{"bad cluster node", "\t\tcluster 127.0.0.1:7000 nohost\n" + secret, `fleet.cluster[1]: "nohost": want host:port, at Testfile:8`},
		{"db on a cluster", "\t\tcluster 127.0.0.1:7000\n\t\tdb 2\n" + secret, "fleet.db: Redis Cluster has only database 0, at Testfile:9"},
		{"two passwords", "\t\tredis 127.0.0.1:6379\n\t\tpassword a\n\t\tpassword_env B\n" + secret, "fleet: the password is given more than once: use one of password_file, password_env, the URL or password, at Testfile:7"},
		{"replicas", "\t\tredis 127.0.0.1:6379\n" + secret + "\t\treplicas 5000\n", "fleet.replicas: 5000: want 0 (count heartbeats) to 1000, at Testfile:10"},
		{"interval", "\t\tredis 127.0.0.1:6379\n" + secret + "\t\tinterval 5ms\n", "fleet.interval: want 10ms to 1m, at Testfile:10"},
		{"timeout", "\t\tredis 127.0.0.1:6379\n" + secret + "\t\tinterval 100ms\n\t\ttimeout 1s\n", "fleet.timeout: want more than 0 and at most 4 intervals, at Testfile:11"},
		{"prefix", "\t\tredis 127.0.0.1:6379\n" + secret + "\t\tprefix {a}\n", `fleet.prefix: "{a}": no { or }: the keys' hash tags follow the prefix, at Testfile:10`},
		{"id", "\t\tredis 127.0.0.1:6379\n" + secret + "\t\tid \"a b\"\n", `fleet.id: "a b": at most 200 bytes, no spaces`},
		{"fraction", "\t\tredis 127.0.0.1:6379\n" + secret + "\t\tpromote_fraction 2\n", "fleet.promote_fraction: 2: want more than 0 and at most 1, at Testfile:10"},
		{"cert without key", "\t\tredis 127.0.0.1:6379\n" + secret + "\t\ttls {\n\t\t\tcert_file /c.pem\n\t\t}\n", "fleet.tls: give cert_file and key_file together, at Testfile:10"},
		{"sentinel without addrs", "\t\tsentinel mymaster\n" + secret, "fleet: sentinel: want the master's name and the sentinels, e.g. sentinel mymaster 10.0.0.21:26379"},
		{"sentinel passwords", "\t\tsentinel m 127.0.0.1:26379 {\n\t\t\tpassword a\n\t\t\tpassword_env B\n\t\t}\n" + secret, "fleet.sentinel: give password or password_env, not both, at Testfile:8"},
		// What the Caddyfile itself finds.
		{"unknown", "\t\tredis 127.0.0.1:6379\n\t\tpool 5\n", `fleet: unrecognized setting "pool": want redis, cluster, sentinel`},
		{"twice", "\t\tredis 127.0.0.1:6379\n\t\tredis 127.0.0.1:6380\n", "fleet: redis is given twice, at Testfile:9"},
		{"no value", "\t\tredis\n", "fleet: redis: want a value, e.g. redis 127.0.0.1:6379"},
		{"two values", "\t\tredis 127.0.0.1:6379 127.0.0.1:6380\n", `fleet: redis: one value only, not also "127.0.0.1:6380"`},
		{"replicas word", "\t\treplicas three\n", `fleet: replicas "three": want a whole number, e.g. replicas 3`},
		{"interval word", "\t\tinterval often\n", `fleet: interval "often": want a duration, e.g. interval 500ms`},
		{"tls value", "\t\ttls on\n", `fleet: tls takes a block or nothing, not "on"`},
		{"tls unknown", "\t\ttls {\n\t\t\tca /x\n\t\t}\n", `fleet: tls: unrecognized setting "ca": want ca_file, cert_file, key_file or server_name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h Handler
			err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(zone + tc.in + "\t}\n}"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
	var h Handler
	err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(zone + "\t\tredis 127.0.0.1:6379\n" + secret + "\t}\n\tfleet {\n\t}\n}"))
	if err == nil || !strings.Contains(err.Error(), "fleet is given twice in this directive: one fleet decides all its zones, at Testfile:11") {
		t.Errorf("two fleet blocks: %v", err)
	}
}

// The JSON form is checked as the Caddyfile is, without a line.
func TestValidateFleet(t *testing.T) {
	h := Handler{Zones: map[string]*Zone{"a": {Key: "{remote_host}", Events: 5, Window: 1e9}}, Fleet: &Fleet{Redis: "127.0.0.1:6379", Secret: "short"}}
	if err := h.Validate(); err == nil || err.Error() != "epochsketch: fleet.secret: a per-deployment secret of at least 16 bytes is required (secret or secret_file): keys are hashed with it before they reach Redis" {
		t.Errorf("got %v", err)
	}
}
