package main

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// dayLog is a day of a site's combined access log, in time order: a crowd
// of 20,000 addresses (Zipf, s = 0.8: the heaviest makes about 3,800
// requests), a scraper at 03:00 and a password brute force at 23:40.
type dayLog struct {
	text              []byte
	scraper, brute    string
	nScraper, nBrute  int
	first, last       time.Time
	lines, crowdLines int
}

func makeDayLog(seed uint64, day time.Time) dayLog {
	rng := rand.New(rand.NewPCG(seed, 1))
	d := dayLog{scraper: "203.0.113.77", brute: "198.51.100.23", nScraper: 8_000, nBrute: 3_000, crowdLines: 120_000}
	// Records first, formatted once in time order: the test runs under -race.
	type rec struct {
		t            time.Time
		ip, req, ua  string
		status, size int
	}
	var recs []rec
	add := func(t time.Time, ip, req string, status int, ua string) {
		recs = append(recs, rec{t, ip, req, ua, status, 200 + rng.IntN(40_000)})
	}
	// The crowd: rank r of 20,000 has weight r^-0.8, drawn by inverse CDF.
	const n, s = 20_000, 0.8
	cdf := make([]float64, n)
	sum := 0.0
	ips := make([]string, n)
	for r := range n {
		sum += math.Pow(float64(r+1), -s)
		cdf[r] = sum
		ips[r] = fmt.Sprintf("10.%d.%d.%d", r>>16&255, r>>8&255, r&255+1)
	}
	paths := []string{"GET / HTTP/1.1", "GET /index.html HTTP/1.1", "GET /blog/ HTTP/1.1", "GET /static/app.js HTTP/1.1", "GET /static/site.css HTTP/1.1", "GET /api/items?page=2 HTTP/1.1", "GET /about HTTP/1.1", "GET /favicon.ico HTTP/1.1"}
	uas := []string{"Mozilla/5.0 (X11; Linux x86_64) Firefox/133.0", "Mozilla/5.0 (Macintosh) Safari/605.1.15", "Mozilla/5.0 (Windows NT 10.0) Chrome/131.0"}
	for range d.crowdLines {
		r := sort.SearchFloat64s(cdf, rng.Float64()*sum)
		add(day.Add(time.Duration(rng.Int64N(int64(24*time.Hour)))), ips[r], paths[rng.IntN(len(paths))], 200, uas[r%len(uas)])
	}
	for i := range d.nScraper { // 03:00 to 03:40, every page of the catalogue
		add(day.Add(3*time.Hour+time.Duration(rng.Int64N(int64(40*time.Minute)))), d.scraper, "GET /catalogue/"+strconv.Itoa(i)+" HTTP/1.1", 200, "python-requests/2.32")
	}
	for range d.nBrute { // 23:40 to 23:50, one login form
		add(day.Add(23*time.Hour+40*time.Minute+time.Duration(rng.Int64N(int64(10*time.Minute)))), d.brute, "POST /login HTTP/1.1", 401, "curl/8.5.0")
	}
	slices.SortStableFunc(recs, func(a, b rec) int { return a.t.Compare(b.t) })
	var b []byte
	for _, r := range recs {
		b = append(b, r.ip...)
		b = append(b, " - - ["...)
		b = r.t.AppendFormat(b, clfTime)
		b = append(b, `] "`...)
		b = append(b, r.req...)
		b = append(b, `" `...)
		b = strconv.AppendInt(b, int64(r.status), 10)
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(r.size), 10)
		b = append(b, ` "-" "`...)
		b = append(b, r.ua...)
		b = append(b, "\"\n"...)
	}
	d.text, d.lines = b, len(recs)
	d.first, d.last = recs[0].t, recs[len(recs)-1].t
	return d
}

// topRow matches a report row: rank, key, estimate.
func topRow(out, key string) (estimate int, ok bool) {
	m := regexp.MustCompile(`(?m)^\d+\s+` + regexp.QuoteMeta(key) + `\s+(\d+)\s*$`).FindStringSubmatch(out)
	if m == nil {
		return 0, false
	}
	fmt.Sscan(m[1], &estimate)
	return estimate, true
}

// A day of an access log with no flags but its format: the tick is chosen
// from the records' span and said on standard error, so that the scraper
// at 03:00 and the brute force at 23:40 both reach the top 10 of the final
// report with their whole counts (the day is one 24-hour tick), from a
// plain file and from gzip. From standard input, which cannot be scanned
// ahead, the report says the span and the flag that covers it, and the
// flag does. A one-shot report has no trend or in-top-since columns: there
// was no earlier report to compare with.
func TestBinaryTopDayLog(t *testing.T) {
	bin := buildBin(t)
	d := makeDayLog(31, time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC))
	dir := t.TempDir()
	plain := filepath.Join(dir, "access.log")
	if err := os.WriteFile(plain, d.text, 0o644); err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	zw.Write(d.text)
	zw.Close()
	gzFile := filepath.Join(dir, "access.log.gz")
	if err := os.WriteFile(gzFile, gz.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	findsBoth := func(name, out string) {
		t.Helper()
		for _, c := range []struct {
			ip string
			n  int
		}{{d.scraper, d.nScraper}, {d.brute, d.nBrute}} {
			est, ok := topRow(out, c.ip)
			// Elephants are never lost; a fingerprint collision may add a little.
			if !ok || est < c.n || est > c.n+c.n/100 {
				t.Errorf("%s: %s (%d requests) not in the top 10 with its count (estimate %d):\n%s", name, c.ip, c.n, est, out)
			}
		}
		if !strings.Contains(out, fmt.Sprintf("final after %d lines (0 empty, 0 malformed", d.lines)) {
			t.Errorf("%s: not every line was counted:\n%s", name, out)
		}
	}
	span := fmt.Sprintf("(%s to %s)", d.first.Format("2006-01-02 15:04:05"), d.last.Format("2006-01-02 15:04:05"))
	for _, file := range []string{plain, gzFile} {
		out, errs, code := runBin(t, bin, nil, "top", "-format", "combined", "-k", "10", file)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", file, code, errs)
		}
		findsBoth(filepath.Base(file), out)
		if !strings.Contains(errs, "the records span 24h "+span+": -tick 24h") {
			t.Errorf("%s: the chosen tick is not said: %q", file, errs)
		}
		if strings.Contains(out, "trend") || strings.Contains(out, "in top since") || strings.Contains(out, "new") {
			t.Errorf("%s: a one-shot report shows columns with nothing to compare:\n%s", file, out)
		}
	}
	// A day rotated at 06:25 crosses a midnight: the tick holds it whole
	// all the same.
	rotated := makeDayLog(32, time.Date(2026, 11, 30, 6, 25, 0, 0, time.UTC))
	rotFile := filepath.Join(dir, "rotated.log")
	if err := os.WriteFile(rotFile, rotated.text, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, errs, code := runBin(t, bin, nil, "top", "-format", "combined", "-k", "10", rotFile); code != 0 || !strings.Contains(errs, "-tick 168h") {
		t.Errorf("a day from 06:25: exit %d, %q", code, errs)
	} else {
		dd := d
		d = rotated
		findsBoth("rotated.log", out)
		d = dd
	}
	out, errs, code := runBin(t, bin, d.text, "top", "-format", "combined", "-k", "10")
	if code != 0 {
		t.Fatalf("standard input: exit %d: %s", code, errs)
	}
	if _, ok := topRow(out, d.scraper); ok {
		t.Errorf("standard input with a 1 s tick still shows the scraper of 03:00: the test does not test the tick:\n%s", out)
	}
	if !strings.Contains(errs, "the records span 24h "+span+", but with -tick 1s") || !strings.Contains(errs, "run again with -tick 24h") {
		t.Errorf("standard input: the span and the flag are not named: %q", errs)
	}
	out, errs, _ = runBin(t, bin, d.text, "top", "-format", "combined", "-k", "10", "-tick", "24h")
	findsBoth("standard input with -tick 24h", out)
	if errs != "" {
		t.Errorf("an explicit -tick is not second-guessed: %q", errs)
	}
}

// The tick chosen for a span is the first of the ladder one of whose ticks
// (Unix time divided by the tick) holds the whole span.
func TestSpanTick(t *testing.T) {
	day := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC) // a Monday: 7-day ticks begin on Thursdays
	for _, c := range []struct {
		lo, hi time.Time
		want   time.Duration
	}{
		{day, day, time.Second},
		{day, day.Add(time.Second - 1), time.Second},
		{day, day.Add(90 * time.Second), 10 * time.Minute},
		{day, day.Add(23*time.Hour + 59*time.Minute), 24 * time.Hour},
		{day.Add(6*time.Hour + 25*time.Minute), day.Add(30*time.Hour + 24*time.Minute), 7 * 24 * time.Hour}, // rotated at 06:25
		{day.Add(-time.Hour), day.Add(23 * time.Hour), 7 * 24 * time.Hour},                                  // a +01:00 day
		{day, day.Add(25 * time.Hour), 7 * 24 * time.Hour},
	} {
		if got := spanTick(c.lo, c.hi); got != c.want {
			t.Errorf("spanTick(%v, %v) = %v, want %v", c.lo, c.hi, got, c.want)
		}
	}
	// Whatever the span and its alignment, the tick holds it in one tick,
	// and no shorter tick of the ladder does.
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		lo := day.Add(time.Duration(r.Int64N(int64(4 * 365 * 24 * time.Hour))))
		hi := lo.Add(time.Duration(r.Int64N(int64([]time.Duration{time.Minute, 48 * time.Hour, 500 * 24 * time.Hour}[r.IntN(3)]))))
		got := spanTick(lo, hi)
		if lo.UnixNano()/int64(got) != hi.UnixNano()/int64(got) {
			t.Fatalf("spanTick(%v, %v) = %v does not hold the span in one tick", lo, hi, got)
		}
		for _, shorter := range spanTicks {
			if shorter < got && hi.Sub(lo) <= shorter && lo.UnixNano()/int64(shorter) == hi.UnixNano()/int64(shorter) {
				t.Fatalf("spanTick(%v, %v) = %v, but %v holds the span", lo, hi, got, shorter)
			}
		}
	}
	for d, want := range map[time.Duration]string{24 * time.Hour: "24h", 10 * time.Minute: "10m", time.Second: "1s", 90 * time.Minute: "1h30m"} {
		if got := tickFlag(d); got != want {
			t.Errorf("tickFlag(%v) = %q, want %q", d, got, want)
		}
	}
}
