package caddyepochsketch

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	in := `epochsketch {
		zone per_ip {
			key {remote_host}
			events 5
			window 10s
		}
		zone api_keys {
			key {http.request.header.X-API-Key}
			events 100
			window 1m
			burst 20
		}
		sketch_buckets 4096
		new_keys off
	}`
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(in)); err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(&h)
	want := `{"zones":{"api_keys":{"key":"{http.request.header.X-API-Key}","events":100,"window":60000000000,"burst":20},` +
		`"per_ip":{"key":"{remote_host}","events":5,"window":10000000000}},"sketch_buckets":4096,"new_keys_off":true}`
	if string(got) != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if err := h.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	if err := h.config().Validate(); err != nil {
		t.Errorf("the engine refuses the zones: %v", err)
	}
}

func TestCaddyfileErrors(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"unknown subdirective", `epochsketch { zones x }`, `unrecognized subdirective "zones"`},
		{"argument on the directive", `epochsketch 5 { }`, `wrong argument count`},
		{"zone without name", `epochsketch { zone { key x } }`, `zone: want a name`},
		{"zone twice", "epochsketch {\nzone a {\nkey x\n}\nzone a {\nkey y\n}\n}", `zone "a" is defined twice`},
		{"bad events", `epochsketch { zone a { key x
			events many } }`, `events "many": want a positive number`},
		{"zero events", `epochsketch { zone a { key x
			events 0 } }`, `events "0": want a positive number`},
		{"bad window", `epochsketch { zone a { key x
			window soon } }`, `window "soon": want a positive duration`},
		{"unknown zone field", `epochsketch { zone a { rate 5 } }`, `zone a: unrecognized subdirective "rate"`},
		{"value missing", "epochsketch {\nzone a {\nkey\n}\n}", `zone a: key: want a value`},
		{"bad buckets", `epochsketch { sketch_buckets lots }`, `sketch_buckets "lots"`},
		{"new_keys on", `epochsketch { new_keys on }`, `'new_keys off'`},
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
		{"no zones", Handler{}, "no zones"},
		{"no key", Handler{Zones: map[string]*Zone{"a": {Events: 1, Window: 1e9}}}, `zone "a" has no key`},
		{"no events", Handler{Zones: map[string]*Zone{"a": {Key: "{remote_host}", Window: 1e9}}}, `zone "a": events 0`},
		{"no window", Handler{Zones: map[string]*Zone{"a": {Key: "{remote_host}", Events: 5}}}, `zone "a": window 0s`},
		{"empty zone", Handler{Zones: map[string]*Zone{"a": nil}}, `zone "a" is empty`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.h.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "epochsketch: ") {
				t.Fatalf("got %v, want an epochsketch: error with %q", err, tc.want)
			}
		})
	}
	// What only the engine checks comes back with its reason, in the
	// Caddyfile's words.
	for _, tc := range []struct {
		zone Zone
		name string
		want string
	}{
		{Zone{Key: "{remote_host}", Events: 5, Window: 1e9}, "bad name!", `epochsketch: zone "bad name!": name: `},
		{Zone{Key: "{remote_host}", Events: 5, Window: 1e9, Burst: 1 << 30}, "a", `epochsketch: zone "a": burst: `},
	} {
		h := Handler{Zones: map[string]*Zone{tc.name: &tc.zone}}
		err := h.config().Validate()
		if err == nil {
			t.Errorf("%+v: the engine took it", tc.zone)
			continue
		}
		if got := h.zoneError(err).Error(); !strings.HasPrefix(got, tc.want) {
			t.Errorf("%+v: %q, want it to start %q", tc.zone, got, tc.want)
		}
	}
}

func TestStripKeyHeaders(t *testing.T) {
	h := map[string][]string{
		"Epochsketch-Zone-0": {"chosen"},
		"Epochsketch_zone_1": {"chosen"},
		"EPOCHSKETCH-ZONE-2": {"chosen"},
		"X-Api-Key":          {"kept"},
		"Epochsketch":        {"kept"},
	}
	stripKeyHeaders(h)
	if len(h) != 2 || h["X-Api-Key"] == nil || h["Epochsketch"] == nil {
		t.Errorf("left %v, want only X-Api-Key and Epochsketch", h)
	}
}

// The JSON form the README shows.
func TestJSONForm(t *testing.T) {
	var h Handler
	in := `{"handler": "epochsketch", "zones": {"per_ip": {"key": "{remote_host}", "events": 5, "window": "10s"}}}`
	if err := json.Unmarshal([]byte(in), &h); err != nil {
		t.Fatal(err)
	}
	if z := h.Zones["per_ip"]; z == nil || z.Key != "{remote_host}" || z.Events != 5 || time.Duration(z.Window) != 10*time.Second {
		t.Fatalf("read %+v", h.Zones["per_ip"])
	}
	if err := h.Validate(); err != nil {
		t.Error(err)
	}
}
