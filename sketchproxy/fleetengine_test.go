package sketchproxy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// CheckFleet and NewEngineFleet say what a config file's fleet section
// says, in the same words; CheckFleet reads no file and no variable, and
// neither changes the config it is given.
func TestEngineFleetChecks(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("too short\n"), 0o600)
	for _, tc := range []struct {
		name         string
		cfg          FleetConfig
		check, start string // "" for none
	}{
		{"valid", FleetConfig{Redis: "127.0.0.1:1", Secret: "a-secret-of-16-bytes-at-least", Interval: Duration(100 * time.Millisecond)}, "", ""},
		{"no redis", FleetConfig{Secret: "a-secret-of-16-bytes-at-least"}, "fleet: say where Redis is", "fleet: say where Redis is"},
		{"short secret", FleetConfig{Redis: "127.0.0.1:1", Secret: "short"}, "fleet.secret: a per-deployment secret of at least 16 bytes", "fleet.secret: a per-deployment secret"},
		{"short secret file", FleetConfig{Redis: "127.0.0.1:1", SecretFile: short}, "", "fleet.secret_file: " + short + " holds 9 bytes"},
		{"missing secret file", FleetConfig{Redis: "127.0.0.1:1", SecretFile: filepath.Join(dir, "none")}, "", "fleet.secret_file: open "},
		{"unset variable", FleetConfig{Redis: "127.0.0.1:1", Secret: "a-secret-of-16-bytes-at-least", PasswordEnv: "SKETCHPROXY_TEST_UNSET"}, "", "fleet.password_env: the environment variable SKETCHPROXY_TEST_UNSET is empty or unset"},
		{"two passwords", FleetConfig{Redis: "127.0.0.1:1", Secret: "a-secret-of-16-bytes-at-least", Password: "a", PasswordEnv: "B"}, "fleet: the password is given more than once", "fleet: the password is given more than once"},
		{"replicas", FleetConfig{Redis: "127.0.0.1:1", Secret: "a-secret-of-16-bytes-at-least", Replicas: -1}, "fleet.replicas: -1: want 0", "fleet.replicas: -1: want 0"},
		{"interval", FleetConfig{Redis: "127.0.0.1:1", Secret: "a-secret-of-16-bytes-at-least", Interval: Duration(time.Millisecond)}, "fleet.interval: want 10ms to 1m", "fleet.interval: want 10ms to 1m"},
		{"ca file", FleetConfig{Redis: "127.0.0.1:1", Secret: "a-secret-of-16-bytes-at-least", TLS: &FleetTLS{CAFile: short}}, "", "fleet.tls.ca_file: " + short + " holds no PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.cfg
			err := CheckFleet(&tc.cfg)
			if !matches(err, tc.check) {
				t.Errorf("CheckFleet: %v, want %q", err, tc.check)
			}
			f, stop, err := NewEngineFleet(&tc.cfg, nil, nil)
			if err == nil {
				stop()
			}
			if f != nil != (err == nil) || !matches(err, tc.start) {
				t.Errorf("NewEngineFleet: %v, want %q", err, tc.start)
			}
			var ce *ConfigError
			if err != nil && !errors.As(err, &ce) {
				t.Errorf("NewEngineFleet's error %T, want a *ConfigError", err)
			}
			if tc.cfg.ID != before.ID || tc.cfg.Interval != before.Interval || tc.cfg.Prefix != before.Prefix {
				t.Error("the config was changed (defaults written into it)")
			}
		})
	}
}

func matches(err error, want string) bool {
	if want == "" {
		return err == nil
	}
	return err != nil && strings.HasPrefix(err.Error(), want)
}
