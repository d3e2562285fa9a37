package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// What nginx and Caddy answer while the decision service is unreachable,
// as docs/operations.md's "While SketchProxy is unreachable" says, with
// its snippets for failing open and failing closed; each snippet must
// appear on that page exactly as here.
var unreachableVariants = []struct {
	gateway, name string
	// edits applies the snippet to the example's config: pairs of the
	// text to find and what to put after it.
	edits []string
	// want is the client's status while the check's connections are
	// refused, and while they are accepted and never answered.
	refused, hung int
}{
	{gateway: "nginx", name: "as shipped", refused: 500, hung: 500},
	{gateway: "nginx", name: "fail open", refused: 200, hung: 200, edits: []string{
		"proxy_pass http://sketchproxy/check;\n", nginxFailOpenAuth,
		"        location @refused {", nginxFailOpenLocation}},
	{gateway: "nginx", name: "fail closed with 503", refused: 503, hung: 503, edits: []string{
		"error_page 403 = @refused;\n", nginxFailClosedMain,
		"        location @refused {", nginxFailClosedLocation}},
	{gateway: "caddy", name: "as shipped", refused: 502, hung: 504},
	{gateway: "caddy", name: "fail open", refused: 200, hung: 200, edits: []string{
		"http://127.0.0.1:@PORT@ {\n", caddyFailOpen}},
	{gateway: "caddy", name: "fail closed with 503", refused: 503, hung: 503, edits: []string{
		"http://127.0.0.1:@PORT@ {\n", caddyFailClosed}},
}

const (
	nginxFailOpenAuth = `            error_page 502 504 = @sketchproxy_unreachable;
`
	nginxFailOpenLocation = `
        location @sketchproxy_unreachable {
            return 204;   # auth_request lets any 2xx through
        }

`
	nginxFailClosedMain = `            error_page 500 = @sketchproxy_unreachable;
`
	nginxFailClosedLocation = `
        location @sketchproxy_unreachable {
            add_header Retry-After 5 always;
            return 503;
        }

`
	caddyFailOpen = `	handle_errors {
		@sketchproxy_unreachable expression ` + "`{http.error.status_code} in [502, 504] && {http.reverse_proxy.upstream.hostport} == \"@CHECK@\"`" + `
		handle @sketchproxy_unreachable {
			reverse_proxy @APP@
		}
	}
`
	caddyFailClosed = `	handle_errors {
		@sketchproxy_unreachable expression ` + "`{http.error.status_code} in [502, 504] && {http.reverse_proxy.upstream.hostport} == \"@CHECK@\"`" + `
		handle @sketchproxy_unreachable {
			header Retry-After 5
			respond 503
		}
	}
`
)

// Shorter than the gateways' defaults (nginx's proxy_read_timeout is 60 s,
// Caddy waits for the check's answer without a bound), so that the test
// sees a hung check end.
const (
	nginxTestTimeout = "            proxy_read_timeout 1s;\n"
	caddyTestTimeout = "\t\t\ttransport http {\n\t\t\t\tresponse_header_timeout 1s\n\t\t\t}\n"
)

// TestGatewayUnreachable runs the nginx and Caddy examples with their
// check pointing at a socket that accepts connections and never answers
// (SketchProxy hung), then at a closed one (SketchProxy down), and checks
// what a client gets, as shipped and with each snippet.
func TestGatewayUnreachable(t *testing.T) {
	page, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "app\n") }))
	defer app.Close()
	for _, v := range unreachableVariants {
		t.Run(v.gateway+"/"+v.name, func(t *testing.T) {
			for i := 0; i+1 < len(v.edits); i += 2 {
				if snippet := v.edits[i+1]; !strings.Contains(string(page), strings.Trim(snippet, "\n")) {
					t.Errorf("docs/operations.md lacks the snippet:\n%s", snippet)
				}
			}
			needTool(t, v.gateway, v.gateway)
			// A listener that never accepts: the kernel completes the
			// handshakes and the requests wait, unanswered.
			hung, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			check := hung.Addr().String()
			name := map[string]string{"nginx": "nginx.conf", "caddy": "Caddyfile"}[v.gateway]
			tmpl, err := os.ReadFile(filepath.Join("..", "..", "examples", v.gateway, name))
			if err != nil {
				t.Fatal(err)
			}
			conf := string(tmpl)
			edits := append([]string{}, v.edits...)
			if v.gateway == "nginx" {
				edits = append(edits, "proxy_pass http://sketchproxy/check;\n", nginxTestTimeout)
			} else {
				edits = append(edits, "\t\t\ttrusted_proxies 127.0.0.1/32\n", caddyTestTimeout)
			}
			for i := 0; i+1 < len(edits); i += 2 {
				at := strings.Index(conf, edits[i])
				if at < 0 {
					t.Fatalf("the example's %s no longer has %q", name, edits[i])
				}
				if strings.HasSuffix(edits[i], "\n") {
					at += len(edits[i])
				}
				conf = conf[:at] + edits[i+1] + conf[at:]
			}
			url := startGateway(t, v.gateway, conf, app.Listener.Addr().String(), check)
			get := func() int {
				resp, err := http.Get(url + "/")
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 503 && resp.Header.Get("Retry-After") != "5" {
					t.Errorf("503 without Retry-After: 5")
				}
				return resp.StatusCode
			}
			if got := get(); got != v.hung {
				t.Errorf("SketchProxy hung: %d, want %d", got, v.hung)
			}
			hung.Close()
			if got := get(); got != v.refused {
				t.Errorf("SketchProxy down: %d, want %d", got, v.refused)
			}
		})
	}
}

// startGateway runs nginx or Caddy on conf (with the examples'
// placeholders) on a free port, and returns its URL. A port can be taken
// between the look and the gateway's bind: up to 5 tries.
func startGateway(t *testing.T, gateway, conf, app, check string) string {
	t.Helper()
	tmp := t.TempDir()
	for _, d := range []string{"body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		os.Mkdir(filepath.Join(tmp, d), 0o755)
	}
	for try := 0; try < 5; try++ {
		port := strconv.Itoa(freePort(t))
		filled := strings.NewReplacer("@TMP@", tmp, "@PORT@", port, "@APP@", app, "@CHECK@", check).Replace(conf)
		var cmd *exec.Cmd
		if gateway == "nginx" {
			os.WriteFile(filepath.Join(tmp, "nginx.conf"), []byte(filled), 0o644)
			bin, err := exec.LookPath("nginx")
			if err != nil {
				bin = "/usr/sbin/nginx"
			}
			cmd = exec.Command(bin, "-q", "-p", tmp, "-c", filepath.Join(tmp, "nginx.conf"), "-g", "daemon off;")
		} else {
			os.WriteFile(filepath.Join(tmp, "Caddyfile"), []byte(filled), 0o644)
			cmd = exec.Command("caddy", "run", "--config", filepath.Join(tmp, "Caddyfile"), "--adapter", "caddyfile")
			cmd.Env = append(os.Environ(), "HOME="+tmp, "XDG_DATA_HOME="+tmp, "XDG_CONFIG_HOME="+tmp)
		}
		out := new(lockedBuffer)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if c, err := net.Dial("tcp", "127.0.0.1:"+port); err == nil {
				c.Close()
				t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); <-exited })
				return "http://127.0.0.1:" + port
			}
			select {
			case <-exited:
				deadline = time.Time{}
			default:
			}
		}
		cmd.Process.Kill()
		<-exited
		t.Logf("%s on port %s did not start: %s", gateway, port, out)
	}
	t.Fatalf("%s did not start", gateway)
	return ""
}
