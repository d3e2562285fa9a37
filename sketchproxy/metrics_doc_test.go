package sketchproxy

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// metricsPage is the metrics reference, docs/metrics.md.
const metricsPage = "docs/metrics.md"

// exposed are the metrics a Middleware exposes, with their label names:
// what its collector describes (every series it can emit, the fleet's and
// Envoy's included) and what its registry gathers (the histograms), and
// the label values seen, by metric and label. It runs one with a fleet
// whose Redis is a closed port, and one request.
func exposed(t *testing.T) (labels map[string][]string, values map[string]map[string][]string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	cfg, err := ParseConfig("p.yaml", []byte("fleet: {redis: \""+closed+"\", secret: 0123456789abcdef0123}\nrules:\n  - limits: [{requests: 5, per: 10s}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := New(cfg, http.NotFoundHandler(), Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	mw.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))

	labels, values = map[string][]string{}, map[string]map[string][]string{}
	ch := make(chan *prometheus.Desc, 256)
	(*collector)(mw).Describe(ch)
	mw.fleet.Describe(ch) // a collector of its own (internal/fleet)
	close(ch)
	reDesc := regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)
	for d := range ch {
		m := reDesc.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read %s", d)
		}
		labels[m[1]] = nil
		if m[2] != "" {
			labels[m[1]] = strings.Split(m[2], ",")
		}
	}
	fams, err := mw.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), "sketchproxy_") {
			continue
		}
		vs := map[string][]string{}
		values[f.GetName()] = vs
		for _, m := range f.GetMetric() {
			var names []string
			for _, lp := range m.GetLabel() {
				names = append(names, lp.GetName())
				if !slices.Contains(vs[lp.GetName()], lp.GetValue()) {
					vs[lp.GetName()] = append(vs[lp.GetName()], lp.GetValue())
				}
			}
			if _, ok := labels[f.GetName()]; !ok {
				labels[f.GetName()] = names
			}
		}
	}
	decisions := map[string][]string{"shadow": {"false", "true"}} // every outcome, not only those decided here
	for o := Allow; o < numOutcomes; o++ {
		decisions["outcome"] = append(decisions["outcome"], o.String())
	}
	values["sketchproxy_decisions_total"] = decisions
	values["sketchproxy_envoy_rls_hits_total"] = decisions // the same labels, for Envoy's rules only
	return labels, values
}

// TestMetricsReference holds docs/metrics.md to the collector: every
// metric it can expose has a row with its labels, and no row names a
// metric it cannot; every outcome has a row that says whether it refuses,
// as Outcome.Refuses does; and every query names metrics, labels
// and label values that exist, the refusals' outcome regexp matching
// exactly the outcomes that refuse.
func TestMetricsReference(t *testing.T) {
	page, err := os.ReadFile(metricsPage)
	if err != nil {
		t.Fatal(err)
	}
	labels, values := exposed(t)
	if len(labels) < 45 {
		t.Fatalf("%d metrics found: the collector is no longer read", len(labels))
	}
	rows := map[string][]string{} // metric → its row's cells
	reRow := regexp.MustCompile("^\\| `([a-z_]+)` \\|(.*)\\|$")
	for _, line := range strings.Split(string(page), "\n") {
		if m := reRow.FindStringSubmatch(line); m != nil {
			cells := strings.Split(m[2], "|")
			for i := range cells {
				cells[i] = strings.TrimSpace(cells[i])
			}
			rows[m[1]] = cells
		}
	}
	for name, want := range labels {
		row, ok := rows[name]
		if !ok {
			t.Errorf("%s: the collector exposes it and %s has no row for it", name, metricsPage)
			continue
		}
		var got []string
		for _, l := range strings.Split(row[1], ",") {
			if l = strings.Trim(strings.TrimSpace(l), "`"); l != "" {
				got = append(got, l)
			}
		}
		if !sameSet(got, want) {
			t.Errorf("%s: %s lists the labels %q, the collector has %q", name, metricsPage, got, want)
		}
	}
	for name, row := range rows {
		if _, ok := labels[name]; !ok && strings.HasPrefix(name, "sketchproxy_") {
			t.Errorf("%s: %s has a row for it, and the collector exposes no such metric", name, metricsPage)
		}
		if o := outcomeNamed(name); o >= 0 {
			if want := map[bool]string{true: "yes", false: "no"}[Outcome(o).Refuses()]; row[0] != want {
				t.Errorf("outcome %s: the table says refusal %q, want %q", name, row[0], want)
			}
		}
	}
	for o := Allow; o < numOutcomes; o++ {
		if _, ok := rows[o.String()]; !ok {
			t.Errorf("outcome %s: no row in %s's outcome table", o, metricsPage)
		}
	}
	checkQueries(t, string(page), labels, values)
}

// checkQueries checks the page's PromQL, in its promql blocks and its
// alerting rules' expr lines: every selector's metric and matchers.
func checkQueries(t *testing.T, page string, labels map[string][]string, values map[string]map[string][]string) {
	var refusing []string
	for o := Allow; o < numOutcomes; o++ {
		if o.Refuses() {
			refusing = append(refusing, o.String())
		}
	}
	reBlock := regexp.MustCompile("(?s)```promql\n(.*?)```|expr: ([^\n]*)")
	reSel := regexp.MustCompile(`(sketchproxy_\w+)(?:\{([^}]*)\})?`)
	reMatch := regexp.MustCompile(`(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	n := 0
	for _, b := range reBlock.FindAllStringSubmatch(page, -1) {
		for _, sel := range reSel.FindAllStringSubmatch(b[1]+b[2], -1) {
			n++
			name := sel[1]
			have, ok := labels[name]
			if !ok {
				t.Errorf("query %q: no metric %s", sel[0], name)
				continue
			}
			for _, m := range reMatch.FindAllStringSubmatch(sel[2], -1) {
				label, op, v := m[1], m[2], m[3]
				if !slices.Contains(have, label) {
					t.Errorf("query %q: %s has no label %s", sel[0], name, label)
					continue
				}
				known := values[name][label]
				switch op {
				case "=":
					if !slices.Contains(known, v) {
						t.Errorf("query %q: %s is never %q (it is one of %q)", sel[0], label, v, known)
					}
				case "=~":
					re := regexp.MustCompile("^(?:" + v + ")$")
					var matched []string
					for _, k := range known {
						if re.MatchString(k) {
							matched = append(matched, k)
						}
					}
					if label == "outcome" && !sameSet(matched, refusing) {
						t.Errorf("query %q: the regexp matches the outcomes %q; the refusals are %q", sel[0], matched, refusing)
					}
				}
			}
		}
	}
	if n < 8 {
		t.Errorf("%d selectors checked in %s: the queries are no longer found", n, metricsPage)
	}
}

// outcomeNamed is the outcome called name, or -1.
func outcomeNamed(name string) int {
	for o := Allow; o < numOutcomes; o++ {
		if o.String() == name {
			return int(o)
		}
	}
	return -1
}

// sameSet reports whether a and b hold the same strings, in any order.
func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
