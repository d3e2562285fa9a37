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

// TestCaddyInsideHandleErrors: a zone inside handle_errors answers its
// refusals itself (an error returned from error routes is never handled:
// Caddy would answer the first error's status, empty).
func TestCaddyInsideHandleErrors(t *testing.T) {
	s := startCaddy(t, `http://127.0.0.1:{{PORT}} {
	respond /ok "ok"
	handle_errors 404 {
		epochsketch {
			zone scan {
				key {remote_host}
				events 2
				window 1h
			}
		}
		respond "not found" 404
	}
	error 404
}
`, "")
	offTheEdge(t)
	codes, last := burst(t, clientFrom("127.0.4.4"), 3, s.url("/nope"))
	if codes != "404 404 429" || !strings.Contains(last.rateLimit, `"scan-per-1h";r=0;`) ||
		!strings.Contains(last.body, `"violated-policies":["scan-per-1h"]`) || last.retryAfter == "" {
		t.Errorf("3 requests for a missing page, 2 an hour in handle_errors: %s; the 429: RateLimit %q, Retry-After %q, body %q",
			codes, last.rateLimit, last.retryAfter, last.body)
	}
	if log := s.log.String(); strings.Contains(log, "error handling handler error") {
		t.Errorf("Caddy logged a refusal as an unhandled error:\n%s", log)
	}
}

// TestCaddyErrorRoutesElsewhere: error routes on the port that would not
// answer a 429 (another site's handle_errors, the site's own for 404
// only) leave the refusal to the handler: the problem+json body, not
// Caddy's empty 429. A site whose handle_errors answers 429 still gets it.
func TestCaddyErrorRoutesElsewhere(t *testing.T) {
	s := startCaddy(t, `http://a.test:{{PORT}} {
	`+zone3+`
	respond "a"
}
http://b.test:{{PORT}} {
	respond "b"
	handle_errors 404 {
		respond "nf"
	}
}
http://c.test:{{PORT}} {
	`+zone3+`
	respond "c"
	handle_errors 404 {
		respond "nf"
	}
}
http://d.test:{{PORT}} {
	`+zone3+`
	respond "d"
	handle_errors {
		respond "custom {err.status_code}"
	}
}
`, "")
	offTheEdge(t)
	port := strconv.Itoa(s.port)
	c := clientFrom("127.0.4.5")
	for _, host := range []string{"a.test", "c.test"} {
		codes, last := burst(t, c, 4, s.url("/"), "Host", host+":"+port)
		if codes != "200 200 200 429" || !strings.Contains(last.rateLimit, `"per_ip-per-1h";r=0;`) ||
			!strings.Contains(last.body, `"violated-policies":["per_ip-per-1h"]`) {
			t.Errorf("%s: %s; the 429: RateLimit %q, body %q; want the problem+json body", host, codes, last.rateLimit, last.body)
		}
	}
	codes, last := burst(t, c, 4, s.url("/"), "Host", "d.test:"+port)
	if codes != "200 200 200 429" || last.body != "custom 429" || !strings.Contains(last.rateLimit, `"per_ip-per-1h";r=0;`) {
		t.Errorf("d.test, whose handle_errors answers every error: %s; the 429: %q, RateLimit %q", codes, last.body, last.rateLimit)
	}
}
