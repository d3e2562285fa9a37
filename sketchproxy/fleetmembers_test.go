package sketchproxy

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/fleet"
)

// membersMiddleware is a Middleware whose fleet's Redis is unreachable,
// with fleet settings extra and state file state, logging into log.
func membersMiddleware(t *testing.T, extra, state string, log io.Writer) *Middleware {
	t.Helper()
	src := fmt.Sprintf("fleet: {redis: %q, secret: 0123456789abcdef, timeout: 50ms%s}\n", deadRedis(t), extra)
	if state != "" {
		src += fmt.Sprintf("state_file: %q\n", state)
	}
	cfg, err := ParseConfig("f.yaml", []byte(src+"rules:\n  - limits: [{requests: 10, per: 1s}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := New(cfg, http.NotFoundHandler(), Options{Logger: slog.New(slog.NewTextHandler(log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mw.Close() })
	return mw
}

// The most replicas seen is kept in the state file with when it was
// seen, and a replica that starts from it while Redis is unreachable
// assumes that many; a handover's state carries it too (WriteState).
func TestFleetMembersInStateFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state")
	at := time.Unix(1_700_000_000, 0)
	a := membersMiddleware(t, "", path, io.Discard)
	if n := a.fleet.Stats().Replicas; n != fleet.UnknownReplicas {
		t.Fatalf("nothing seen, Redis unreachable: %d replicas, want %d", n, fleet.UnknownReplicas)
	}
	a.fleet.RestoreMembers(4, at) // as if seen then
	if err := a.SaveState(); err != nil {
		t.Fatal(err)
	}
	var handed bytes.Buffer
	if err := a.WriteState(&handed); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	b := membersMiddleware(t, "", path, &log)
	if n := b.fleet.Stats().Replicas; n != 4 {
		t.Errorf("started from a state file that saw 4 replicas, Redis unreachable: %d", n)
	}
	if n, when := b.fleet.Members(); n != 4 || !when.Equal(at) {
		t.Errorf("kept for the next state file: %d at %v, want 4 at %v", n, when, at)
	}
	if !strings.Contains(log.String(), "the last membership seen is restored") || strings.Contains(log.String(), "number of replicas unknown") {
		t.Errorf("the log of a replica restored from a state file:\n%s", log.String())
	}
	c := membersMiddleware(t, "", "", io.Discard)
	if err := c.RestoreState(&handed, "handover"); err != nil {
		t.Fatal(err)
	}
	if n := c.fleet.Stats().Replicas; n != 4 {
		t.Errorf("restored from a handover that saw 4 replicas: %d", n)
	}
	if w := FleetSizeWarning(b.state.Load().cfg); w != "" {
		t.Errorf("a state file that keeps a membership is warned about: %s", w)
	}
}

// A fleet that gives neither replicas nor min_replicas, where no state
// file keeps a membership, is warned about at start (cmd/sketchproxy) and
// by -check, with what to set; and once by the fleet when Redis is
// unreachable and it assumes fleet.UnknownReplicas.
func TestFleetSizeWarning(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name, extra, state, want string
	}{
		{"replicas", ", replicas: 3", "", ""},
		{"min_replicas", ", min_replicas: 3", "", ""},
		{"nothing", "", "", "there is no state_file to keep the last membership seen: a replica that has not reached Redis assumes 2 replicas, so a fleet of N started while Redis is down admits N/2 times the limit until Redis answers (1.5 times for 3); set fleet.min_replicas to the number of replicas you run (or fleet.replicas to fix N)"},
		{"a state file of none yet", "", filepath.Join(dir, "none"), "the state_file keeps no membership yet"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var log bytes.Buffer
			mw := membersMiddleware(t, c.extra, c.state, &log)
			w := FleetSizeWarning(mw.state.Load().cfg)
			switch {
			case c.want == "" && w != "":
				t.Errorf("warned: %s", w)
			case c.want != "" && !strings.Contains(w, c.want):
				t.Errorf("warning %q, want %q", w, c.want)
			}
			logged := strings.Count(log.String(), "number of replicas unknown: a replica that has not reached Redis assumes 2 replicas")
			if want := map[bool]int{true: 0, false: 1}[c.want == ""]; logged != want {
				t.Errorf("the fleet said it assumes 2 replicas %d times, want %d:\n%s", logged, want, log.String())
			}
		})
	}
}
