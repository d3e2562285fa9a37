package caddyepochsketch

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Caddyfiles a user writes, run in the built Caddy: each test first gets
// a 429 with the RateLimit field where the limiter should run.

// twoZones is a site with two zones of 2 an hour, on /a and on /b; {{LINES}}
// stands for the lines a user adds before the directive.
const twoZones = `http://127.0.0.1:{{PORT}} {
{{LINES}}
	epochsketch {
		zone a {
			key {remote_host}
			events 2
			window 1h
			match {
				path /a
			}
		}
		zone b {
			key {remote_host}
			events 2
			window 1h
			match {
				path /b
			}
		}
	}
	respond "ok"
}
`

// TestCaddyUnrelatedEditsKeepCounts reloads a site with lines added before
// its directive that Caddy merges into matcher-less routes of their own
// (header, then redir with a matcher; a named matcher with respond): the
// zones' counts stay, as they do when nothing changed.
func TestCaddyUnrelatedEditsKeepCounts(t *testing.T) {
	site := func(lines string) string { return strings.Replace(twoZones, "{{LINES}}", lines, 1) }
	s := startCaddy(t, site(""), "")
	offTheEdge(t)
	c := clientFrom("127.0.4.1")
	codes, last := burst(t, c, 3, s.url("/a"))
	if codes != "200 200 429" || !strings.Contains(last.rateLimit, `"a-per-1h";r=0;`) {
		t.Fatalf("/a at 2 an hour: %s, RateLimit %q; want 200 200 429 with the field", codes, last.rateLimit)
	}
	for i, lines := range []string{
		"\theader X-Foo bar\n\tredir /old /new",
		"\theader X-Foo bar\n\tredir /old /new\n\t@m path /m\n\trespond @m \"m\"",
		"\trewrite /zz /yy\n\tencode gzip",
		"",
	} {
		s.reload(site(lines), i+2)
		if a := get(t, c, s.url("/a")); a.code != 429 || !strings.Contains(a.rateLimit, `"a-per-1h";r=0;`) {
			t.Errorf("/a after a reload that adds %q: %d, RateLimit %q; want 429, the count kept", lines, a.code, a.rateLimit)
		}
	}
}

// TestCaddyOneSiteTwoPorts: one site block on two ports (Caddy makes a
// server of each port) is one place: one count.
func TestCaddyOneSiteTwoPorts(t *testing.T) {
	s := startCaddy(t, `http://127.0.0.1:{{PORT}}, http://127.0.0.1:{{PORT2}} {
	`+zone3+`
	respond "ok"
}
`, "")
	offTheEdge(t)
	c := clientFrom("127.0.4.2")
	other := "http://127.0.0.1:" + strconv.Itoa(s.port2) + "/"
	got, _ := burst(t, c, 2, s.url("/"))
	more, last := burst(t, c, 2, other)
	if got+" "+more != "200 200 200 429" || !strings.Contains(last.rateLimit, `"per_ip-per-1h";r=0;`) {
		t.Errorf("2 requests on one port, then 2 on the other, at 3 an hour: %s %s, RateLimit %q; want 200 200 200 429", got, more, last.rateLimit)
	}
}

// TestCaddyTryFiles: behind try_files (a front controller), a zone on
// epochsketch_path /login judges /login, which reaches the directive
// rewritten to /index.php.
func TestCaddyTryFiles(t *testing.T) {
	s := startCaddy(t, `http://127.0.0.1:{{PORT}} {
	root * {{DIR}}/www
	try_files {path} /index.php?{query}
	epochsketch {
		zone login {
			key {remote_host}
			events 2
			window 1h
			match {
				epochsketch_path /login
			}
		}
	}
	reverse_proxy {{UPSTREAM}}
}
`, app(t))
	if err := os.MkdirAll(filepath.Join(s.dir, "www"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.dir, "www", "index.php"), []byte("<?php\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	offTheEdge(t)
	c := clientFrom("127.0.4.3")
	codes, last := burst(t, c, 3, s.url("/login?u=1"))
	if codes != "200 200 429" || !strings.Contains(last.rateLimit, `"login-per-1h";r=0;`) {
		t.Errorf("/login, rewritten to /index.php, at 2 an hour: %s, RateLimit %q; want 200 200 429", codes, last.rateLimit)
	}
	if a := get(t, c, s.url("/other")); a.code != 200 || !strings.HasPrefix(a.seenURI, "/index.php") || a.rateLimit != "" {
		t.Errorf("/other: %d, reached the app as %q, RateLimit %q; want 200 as /index.php, judged by no zone", a.code, a.seenURI, a.rateLimit)
	}
}
