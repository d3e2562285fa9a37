package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// writeCerts writes a CA, a server certificate for 127.0.0.1 and a client
// certificate, PEM, into dir.
func writeCerts(t *testing.T, dir string) {
	t.Helper()
	key := func(name string) *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		der, _ := x509.MarshalECPrivateKey(k)
		os.WriteFile(filepath.Join(dir, name+".key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
		return k
	}
	caKey := key("ca")
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "ca.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644)
	caCert, _ := x509.ParseCertificate(caDER)
	for i, name := range []string{"server", "client"} {
		k := key(name)
		c := &x509.Certificate{SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
			NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
		der, err := x509.CreateCertificate(rand.Reader, c, caCert, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, name+".pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	}
}

// fleetACL is the least a fleet needs: its own keys and claims channel,
// and the commands its rounds send (the script's HGETALL, HSET, HDEL,
// PEXPIRE, TIME and PUBLISH included, and the index of heavy keys' SETBIT
// and GETRANGE).
const fleetACL = "on >%s ~sketchproxy:* resetchannels &sketchproxy:* -@all +evalsha +eval +script|load +set +get +zadd +zremrangebyscore +zcard +pexpire +ping +hgetall +hset +hdel +setbit +getrange +time +publish +subscribe"

// TestFleetRedisTLSAndACL runs a replica against a TLS-only redis-server
// that requires client certificates and an ACL user whose password is read
// from a file, with only the commands a fleet needs: the fleet comes up,
// hears the claims and syncs a heavy key. A user without the claims'
// channel still syncs, and says what it misses.
func TestFleetRedisTLSAndACL(t *testing.T) {
	dir := t.TempDir()
	writeCerts(t, dir)
	os.WriteFile(filepath.Join(dir, "password"), []byte("fleet-pw-0123\n"), 0o600)
	port := freePort(t)
	// redis-server reads an option's words as separate arguments.
	args := []string{"--port", "0", "--tls-port", strconv.Itoa(port),
		"--tls-cert-file", filepath.Join(dir, "server.pem"), "--tls-key-file", filepath.Join(dir, "server.key"),
		"--tls-ca-cert-file", filepath.Join(dir, "ca.pem"), "--tls-auth-clients", "yes",
		"--user", "default", "off", "--user", "fleet"}
	args = append(args, strings.Fields(fmt.Sprintf(fleetACL, "fleet-pw-0123"))...)
	// deaf has the least ACL but the claims: no channel, PUBLISH or SUBSCRIBE.
	deaf := strings.NewReplacer(" &sketchproxy:*", "", " +publish", "", " +subscribe", "").Replace(fmt.Sprintf(fleetACL, "fleet-pw-0123"))
	args = append(append(args, "--user", "deaf"), strings.Fields(deaf)...)
	startRedisWith(t, port, false, args...)
	url, admin, out, cfg := oneReplica(t, dir, fmt.Sprintf(`  redis: "rediss://fleet@127.0.0.1:%d/0"
  password_file: %q
  tls: {ca_file: %q, cert_file: %q, key_file: %q}`,
		port, filepath.Join(dir, "password"), filepath.Join(dir, "ca.pem"), filepath.Join(dir, "client.pem"), filepath.Join(dir, "client.key")))
	// The heavy key is promoted once its estimate passes half the limit:
	// keep it sending until a round syncs it, however slow this machine
	// is today (one burst of 30 was not always enough under -race).
	deadline := time.Now().Add(30 * time.Second)
	for metricValue(t, admin, "sketchproxy_fleet_key_syncs_total") == 0 && time.Now().Before(deadline) {
		if n := sendHeavy(url, 10); n != 0 {
			t.Fatalf("%d requests failed", n)
		}
	}
	if up, syncs, errs := metricValue(t, admin, "sketchproxy_fleet_up"), metricValue(t, admin, "sketchproxy_fleet_key_syncs_total"), metricValue(t, admin, "sketchproxy_fleet_sync_errors_total"); up != 1 || syncs == 0 || errs != 0 {
		t.Fatalf("fleet_up %v, key syncs %v, sync errors %v, promotions %v, hot keys %v\n%s", up, syncs, errs, metricValue(t, admin, "sketchproxy_fleet_promotions_total"), metricValue(t, admin, "sketchproxy_fleet_hot_keys"), out)
	}
	// The least ACL lets it keep the index of heavy keys (SETBIT and
	// GETRANGE; a replica reads it at its first round)...
	if strings.Contains(out.String(), "refused the index of heavy keys") {
		t.Errorf("with the least ACL Redis refused the index of heavy keys:\n%s", out)
	}
	// ... and hear the other replicas' claims.
	for deadline := time.Now().Add(10 * time.Second); metricValue(t, admin, "sketchproxy_fleet_claims_subscribed") != 1; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not subscribed to the claims with the least ACL\n%s", out)
		}
	}
	// Without the claims' ACL a replica still syncs (the script's PUBLISH
	// fails alone), and says that it does not hear the others' claims.
	dir2 := t.TempDir()
	url2, admin2, out2, _ := oneReplica(t, dir2, fmt.Sprintf(`  redis: "rediss://deaf@127.0.0.1:%d/0"
  password_file: %q
  tls: {ca_file: %q, cert_file: %q, key_file: %q}`,
		port, filepath.Join(dir, "password"), filepath.Join(dir, "ca.pem"), filepath.Join(dir, "client.pem"), filepath.Join(dir, "client.key")))
	waitFor(t, out2, regexp.MustCompile(`fleet: not hearing the other replicas' claims`))
	for deadline := time.Now().Add(30 * time.Second); metricValue(t, admin2, "sketchproxy_fleet_key_syncs_total") == 0; {
		if time.Now().After(deadline) {
			t.Fatalf("without the claims' ACL the fleet did not sync\n%s", out2)
		}
		if n := sendHeavy(url2, 10); n != 0 {
			t.Fatalf("%d requests failed", n)
		}
	}
	if e, h := metricValue(t, admin2, "sketchproxy_fleet_sync_errors_total"), metricValue(t, admin2, "sketchproxy_fleet_claims_subscribed"); e != 0 || h != 0 {
		t.Errorf("without the claims' ACL: %v sync errors, claims_subscribed %v; want 0 and 0", e, h)
	}
	// The same server refuses a replica without the client certificate.
	os.WriteFile(cfg, []byte(strings.Replace(mustRead(t, cfg), fmt.Sprintf(", cert_file: %q, key_file: %q", filepath.Join(dir, "client.pem"), filepath.Join(dir, "client.key")), "", 1)), 0o644)
	_, out3 := start(t, build(t), "-config", cfg)
	waitFor(t, out3, regexp.MustCompile(`fleet: Redis unreachable`))
}

// oneReplica starts one sketchproxy with fleet (YAML lines indented by two
// spaces) and a 40-per-2s rule keyed on X-Key in front of an "ok" upstream,
// and waits until Redis is reachable. It returns the proxy's URL, its admin
// URL, its output and its config file.
func oneReplica(t *testing.T, dir, fleet string) (url, admin string, out *lockedBuffer, cfg string) {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") }))
	t.Cleanup(up.Close)
	cfg = filepath.Join(dir, "r.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstream: %q
fleet:
%s
  secret: "test-secret-0123456789"
  interval: 100ms
  timeout: 200ms
rules:
  - name: api
    key: ["header:X-Key"]
    limits: [{requests: 40, per: 2s}]
`, up.URL, fleet)), 0o644)
	_, out = start(t, build(t), "-config", cfg)
	url = "http://" + waitFor(t, out, regexp.MustCompile(`msg="sketchproxy listening" addr=(\S+)`))[1] + "/"
	admin = "http://" + waitFor(t, out, regexp.MustCompile(`msg="admin listening" addr=(\S+)`))[1]
	waitFor(t, out, regexp.MustCompile(`fleet: Redis reachable`)) // keys are promoted only while it is
	return url, admin, out, cfg
}

// sendHeavy sends n requests of key "heavy" to url, 10 ms apart, and
// returns how many failed (neither 200 nor 429).
func sendHeavy(url string, n int) (failed int) {
	for range n {
		if _, ok := ask(http.DefaultClient, url, "heavy"); !ok {
			failed++
		}
		time.Sleep(10 * time.Millisecond)
	}
	return failed
}

func mustRead(t *testing.T, path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestFleetRedisCluster runs three replicas against a real Redis Cluster of
// three masters and three replicas (redis-cli --cluster create), drives a
// heavy key at 3x its limit, kills the master holding most of the fleet's
// keys, and checks that no request fails, the cluster fails over, the fleet
// comes back, and the heavy key stays near its limit throughout.
func TestFleetRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the cluster test runs about 30 s")
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("no redis-cli in CI (.ci/run installs Debian's redis-server, which has it)")
		}
		t.Skip("no redis-cli (Debian: redis-tools)")
	}
	dir := t.TempDir()
	var nodes []*redisServer
	var addrs []string
	for i := range 6 {
		nd := filepath.Join(dir, strconv.Itoa(i))
		os.MkdirAll(nd, 0o755)
		r := startRedisWith(t, 0, true, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(nd, "nodes.conf"),
			"--cluster-node-timeout", "1000", "--dir", nd)
		nodes = append(nodes, r)
		addrs = append(addrs, r.addr())
	}
	create := exec.Command(cli, append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "1", "--cluster-yes")...)
	if out, err := create.CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	clusterOK := func() bool {
		out, _ := exec.Command(cli, "-h", "127.0.0.1", "-p", strconv.Itoa(nodes[0].port), "cluster", "info").Output()
		if strings.Contains(string(out), "cluster_state:ok") {
			return true
		}
		out, _ = exec.Command(cli, "-h", "127.0.0.1", "-p", strconv.Itoa(nodes[1].port), "cluster", "info").Output()
		return strings.Contains(string(out), "cluster_state:ok")
	}
	for deadline := time.Now().Add(20 * time.Second); !clusterOK(); {
		if time.Now().After(deadline) {
			t.Fatal("the cluster did not reach cluster_state:ok")
		}
		time.Sleep(100 * time.Millisecond)
	}

	bin := build(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") }))
	defer up.Close()
	var reps []*replica
	for i := range 3 {
		cfg := filepath.Join(dir, fmt.Sprintf("r%d.yaml", i))
		os.WriteFile(cfg, []byte(fmt.Sprintf(`listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstream: %q
new_keys: {disabled: true}
fleet:
  cluster: [%q, %q]
  secret: "test-secret-0123456789"
  id: r%d
  interval: 200ms
  timeout: 150ms
rules:
  - name: api
    key: ["header:X-Key"]
    limits: [{name: rate, requests: %d, per: 2s}]
`, up.URL, addrs[0], addrs[1], i, fleetLimit)), 0o644)
		rep := &replica{}
		rep.cmd, rep.out = start(t, bin, "-config", cfg)
		rep.url = "http://" + waitFor(t, rep.out, regexp.MustCompile(`msg="sketchproxy listening" addr=(\S+)`))[1] + "/"
		rep.admin = "http://" + waitFor(t, rep.out, regexp.MustCompile(`msg="admin listening" addr=(\S+)`))[1]
		reps = append(reps, rep)
	}
	sum := func(name string) float64 {
		var s float64
		for _, r := range reps {
			s += metricValue(t, r.admin, name)
		}
		return s
	}
	for deadline := time.Now().Add(10 * time.Second); sum("sketchproxy_fleet_replicas") != 9; {
		if time.Now().After(deadline) {
			t.Fatalf("the replicas did not count each other through the cluster: %v", sum("sketchproxy_fleet_replicas"))
		}
		time.Sleep(50 * time.Millisecond)
	}

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 5 * time.Second}
	ex := &exactGlobal{tick: time.Second, theta: fleetLimit, free: true, m: map[string][2]int64{}}
	type phase struct{ sent, allowed, want, failed atomic.Int64 }
	run := func(p *phase, d time.Duration) {
		var wg sync.WaitGroup
		for k := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tk := time.NewTicker(time.Second / 60) // 60 a second: 3x
				defer tk.Stop()
				end := time.Now().Add(d)
				for i := 0; time.Now().Before(end); i++ {
					<-tk.C
					key := fmt.Sprint("heavy", k)
					if ex.observe(key, time.Now()) {
						p.want.Add(1)
					}
					req, _ := http.NewRequest("GET", reps[i%3].url, nil)
					req.Header.Set("X-Key", key)
					resp, err := client.Do(req)
					p.sent.Add(1)
					if err != nil {
						p.failed.Add(1)
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					switch resp.StatusCode {
					case 200:
						p.allowed.Add(1)
					case 429:
					default:
						p.failed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
	}
	var before, during phase
	run(&before, 5*time.Second)
	// Kill the master that serves the first hash tag's slot.
	slotOut, _ := exec.Command(cli, "-c", "-h", "127.0.0.1", "-p", strconv.Itoa(nodes[0].port), "cluster", "keyslot", "{t0}").Output()
	slot, _ := strconv.Atoi(strings.TrimSpace(string(slotOut)))
	var victim *redisServer
	shards, _ := exec.Command(cli, "-h", "127.0.0.1", "-p", strconv.Itoa(nodes[0].port), "cluster", "nodes").Output()
	for _, line := range strings.Split(string(shards), "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || !strings.Contains(f[2], "master") {
			continue
		}
		for _, rng := range f[8:] {
			lo, hi, _ := strings.Cut(rng, "-")
			l, _ := strconv.Atoi(lo)
			h, err := strconv.Atoi(hi)
			if err != nil {
				h = l
			}
			if slot >= l && slot <= h {
				for _, n := range nodes {
					if strings.HasPrefix(f[1], n.addr()+"@") {
						victim = n
					}
				}
			}
		}
	}
	if victim == nil {
		t.Fatalf("no master found for slot %d in\n%s", slot, shards)
	}
	victim.kill()
	run(&during, 8*time.Second)
	failedOver := clusterOK()
	upAfter := sum("sketchproxy_fleet_up")
	report := func(name string, p *phase) {
		t.Logf("%-28s %4d sent, %4d allowed (the exact limiter: %d), %d failed", name, p.sent.Load(), p.allowed.Load(), p.want.Load(), p.failed.Load())
	}
	report("cluster up", &before)
	report("master killed, failover", &during)
	t.Logf("cluster_state ok after the failover: %v; fleet_up summed: %v; sync errors: %v; round time sum: %.3f s over %.0f rounds",
		failedOver, upAfter, sum("sketchproxy_fleet_sync_errors_total"), sum("sketchproxy_fleet_round_duration_seconds_sum"), sum("sketchproxy_fleet_round_duration_seconds_count"))
	if before.failed.Load()+during.failed.Load() != 0 {
		t.Errorf("%d requests failed", before.failed.Load()+during.failed.Load())
	}
	if !failedOver || upAfter != 3 {
		t.Errorf("after the failover: cluster ok %v, fleet_up summed %v, want true and 3", failedOver, upAfter)
	}
	// Each replica counts within its share of a key: near the exact
	// limiter, which counts whole requests (the engine 2 counts each), also
	// while a master fails over (its keys' records are written again).
	for name, p := range map[string]*phase{"before": &before, "during": &during} {
		if float64(p.allowed.Load()) > 1.15*float64(p.want.Load()) {
			t.Errorf("%s: %d allowed at 3x the limit, the exact limiter %d: the cluster did not share the counts", name, p.allowed.Load(), p.want.Load())
		}
	}
}

// TestFleetRedisSentinel runs a replica against a master found through
// Redis Sentinel, kills the master, and checks that the sentinel's failover
// to the replica brings the fleet back, with no failed request.
func TestFleetRedisSentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the sentinel test runs about 15 s")
	}
	master := startRedis(t, 0)
	startRedisWith(t, 0, true, "--replicaof", "127.0.0.1", strconv.Itoa(master.port))
	dir := t.TempDir()
	sport := freePort(t)
	conf := filepath.Join(dir, "sentinel.conf")
	os.WriteFile(conf, []byte(fmt.Sprintf("port %d\nbind 127.0.0.1\nsentinel monitor fleetmaster 127.0.0.1 %d 1\nsentinel down-after-milliseconds fleetmaster 1000\nsentinel failover-timeout fleetmaster 5000\n", sport, master.port)), 0o644)
	bin, _ := exec.LookPath("redis-server")
	sentinel := exec.Command(bin, conf, "--sentinel")
	sout := new(lockedBuffer)
	sentinel.Stdout, sentinel.Stderr = sout, sout
	if err := sentinel.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sentinel.Process.Kill(); sentinel.Wait() })

	url, admin, out, _ := oneReplica(t, dir, fmt.Sprintf(`  sentinel: {master: fleetmaster, addrs: ["127.0.0.1:%d"]}`, sport))
	var failed atomic.Int64
	send := func(n int) { failed.Add(int64(sendHeavy(url, n))) }
	send(30)
	syncsBefore := metricValue(t, admin, "sketchproxy_fleet_key_syncs_total")
	master.kill()
	// Requests go on through the outage and the failover.
	deadline := time.Now().Add(20 * time.Second)
	for {
		send(10)
		if metricValue(t, admin, "sketchproxy_fleet_up") == 1 && metricValue(t, admin, "sketchproxy_fleet_key_syncs_total") > syncsBefore+5 &&
			strings.Contains(sout.String(), "+switch-master") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no failover: fleet_up %v, key syncs %v (before %v)\nsentinel:\n%s\nsketchproxy:\n%s", metricValue(t, admin, "sketchproxy_fleet_up"),
				metricValue(t, admin, "sketchproxy_fleet_key_syncs_total"), syncsBefore, sout, out)
		}
	}
	if failed.Load() != 0 {
		t.Errorf("%d requests failed", failed.Load())
	}
	t.Logf("the sentinel switched the master; the fleet syncs again (%v key syncs before the kill, %v now)", syncsBefore, metricValue(t, admin, "sketchproxy_fleet_key_syncs_total"))
}
