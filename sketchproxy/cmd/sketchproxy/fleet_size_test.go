package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// -check warns about a fleet that cannot know its size while Redis is
// down (neither replicas nor min_replicas, no state file keeping a
// membership), saying what to set; min_replicas silences it.
func TestCheckWarnsFleetSize(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		extra string
		warn  bool
	}{{"", true}, {", min_replicas: 3", false}, {", replicas: 3", false}} {
		cfg := filepath.Join(dir, "p.yaml")
		os.WriteFile(cfg, []byte(`upstream: "http://127.0.0.1:9000"
fleet: {redis: "127.0.0.1:1", secret: 0123456789abcdef`+c.extra+`}
rules:
  - limits: [{requests: 1, per: 1s}]
`), 0o644)
		var out, errb bytes.Buffer
		code := run([]string{"-config", cfg, "-check"}, &out, &errb)
		warned := strings.Contains(errb.String(), "warning: fleet: neither replicas nor min_replicas is set and there is no state_file to keep the last membership seen") &&
			strings.Contains(errb.String(), "set fleet.min_replicas to the number of replicas you run")
		if code != 0 || warned != c.warn {
			t.Errorf("fleet {...%s}: exit %d, warned %v, want %v\n%s%s", c.extra, code, warned, c.warn, out.String(), errb.String())
		}
	}
}
