package sketchproxy

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startWithState(t *testing.T, yaml string, clk *epochsketch.ManualClock) (*Middleware, *syncBuffer) {
	t.Helper()
	cfg, err := ParseConfig("state.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	mw, err := New(cfg, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		Options{Clock: clk, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return mw, logs
}

func code(mw *Middleware, ip string) int {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = ip + ":1"
	w := httptest.NewRecorder()
	mw.ServeHTTP(w, r)
	return w.Code
}

// A restart keeps the counts: an abuser refused before the restart is
// refused after it, until the decay over the downtime lets it back.
func TestStateSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	yaml := "state_file: " + filepath.Join(dir, "state") + "\nrules:\n  - name: a\n    limits: [{name: r, requests: 5, per: 10m}]\n"
	clk := epochsketch.NewManualClock(t0)
	mw, _ := startWithState(t, yaml, clk)
	for range 20 {
		code(mw, "203.0.113.9")
	}
	if c := code(mw, "203.0.113.9"); c != 429 {
		t.Fatalf("before the restart: %d", c)
	}
	if err := mw.Close(); err != nil { // graceful shutdown saves
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(dir, "state")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("state file: %v %v", err, st)
	}
	clk.Advance(3 * time.Second) // a quick redeploy
	mw2, logs := startWithState(t, yaml, clk)
	defer mw2.Close()
	if !strings.Contains(logs.String(), `msg="state restored"`) || !strings.Contains(logs.String(), "age=3s") {
		t.Errorf("no restore line with the age: %s", logs.String())
	}
	if c := code(mw2, "203.0.113.9"); c != 429 {
		t.Errorf("after the restart the abuser got %d: the restart handed it a fresh budget", c)
	}
	if c := code(mw2, "203.0.113.10"); c != 200 {
		t.Errorf("another client after the restart: %d", c)
	}
	clk.Advance(5 * time.Minute) // the decay over a longer downtime frees it
	if c := code(mw2, "203.0.113.9"); c != 200 {
		t.Errorf("after the decay: %d", c)
	}
}

// A bad state file is logged and the proxy starts empty; startup goes on.
func TestBadStateFileStartsEmpty(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state")
	yaml := "state_file: " + p + "\nsketch: {buckets: 1024}\nrules:\n  - name: a\n    limits: [{name: r, requests: 5, per: 10s}]\n"
	clk := epochsketch.NewManualClock(t0)
	mw, _ := startWithState(t, yaml, clk)
	for range 20 {
		code(mw, "203.0.113.9")
	}
	mw.Close()
	good, _ := os.ReadFile(p)
	for _, c := range []struct {
		name string
		data []byte
		want string
	}{
		{"garbage", []byte("garbage garbage garbage"), "not a SketchProxy state file"},
		{"truncated", good[:len(good)/2], "truncated"},
		{"bit flip", func() []byte { b := bytes.Clone(good); b[len(b)/3] ^= 1; return b }(), "checksum mismatch"},
		{"no end", good[:len(good)-8], "the end marker is missing"},
	} {
		os.WriteFile(p, c.data, 0o600)
		mw, logs := startWithState(t, yaml, clk)
		if !strings.Contains(logs.String(), "state file rejected: starting empty") || !strings.Contains(logs.String(), c.want) {
			t.Errorf("%s: logs %s", c.name, logs.String())
		}
		if got := code(mw, "203.0.113.9"); got != 200 {
			t.Errorf("%s: did not start empty: %d", c.name, got)
		}
		mw.Close()
	}
	// A config whose sketch changed size skips that sketch and says so.
	os.WriteFile(p, good, 0o600)
	mw2, logs := startWithState(t, "state_file: "+p+"\nsketch: {buckets: 2048}\nrules:\n  - name: a\n    limits: [{name: r, requests: 5, per: 10s}]\n", clk)
	defer mw2.Close()
	if !strings.Contains(logs.String(), "skipped=2") { // the limit's and new_keys' memory
		t.Errorf("resized sketch: %s", logs.String())
	}
}

// A version 2 state file (written by the build before SketchProxy counted
// 2 a request, 19c5ade, in which 203.0.113.66 climbed past ban_above)
// still restores its bans and memory of keys: an upgrade lifts no ban.
// Its limits' counts, which meant other numbers, start empty.
func TestStateVersion2KeepsBans(t *testing.T) {
	data, err := os.ReadFile("testdata/state-v2-ban.state")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "state")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	clk := epochsketch.NewManualClock(t0.Add(10 * time.Second))
	mw, logs := startWithState(t, "state_file: "+path+`
rules:
  - name: api
    tarpit: true
    limits: [{requests: 20, per: 1m}]
`, clk)
	defer mw.Close()
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "203.0.113.66:1"
	w := httptest.NewRecorder()
	mw.ServeHTTP(w, r)
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Connection") != "close" {
		t.Errorf("the client banned before the upgrade: %d, Connection %q; want 429 and close (log: %s)", w.Code, w.Header().Get("Connection"), logs.String())
	}
	if !strings.Contains(logs.String(), "state restored") || strings.Contains(logs.String(), "0001-01-01") {
		t.Errorf("log: %s", logs.String())
	}
}

// HandOverState saves the state file for a successor, then holds every
// later save, a Close's included, so that the old process never
// overwrites what the successor restored; resume (a failed handover)
// lifts the hold.
func TestHandOverStateHoldsSaves(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state")
	yaml := "state_file: " + p + "\nrules:\n  - name: a\n    limits: [{name: r, requests: 5, per: 10s}]\n"
	mw, _ := startWithState(t, yaml, epochsketch.NewManualClock(t0))
	resume, err := mw.HandOverState()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("not saved at the handover: %v", err)
	}
	os.Remove(p) // the successor's now
	if err := mw.SaveState(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err == nil {
		t.Error("a save after the handover wrote the file")
	}
	resume()
	if err := mw.SaveState(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Errorf("no save after resume: %v", err)
	}
	os.Remove(p)
	if _, err := mw.HandOverState(); err != nil {
		t.Fatal(err)
	}
	os.Remove(p)
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err == nil {
		t.Error("Close after a handover wrote the file over the successor's")
	}
}
