// Package e2e drives the browser simulator in headless Chromium and checks
// that the bits and estimates the page shows are what the Go package
// computes for the same seed and steps. It is its own module so that the
// library's module needs no browser driver.
//
// It needs Chromium (Debian: chromium; .ci/run installs it). Without one it
// skips and says so, except under CI, where it fails.
package e2e

import (
	"context"
	"fmt"
	"iter"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/epochsketch/epochsketch/simulator"
	"github.com/epochsketch/epochsketch/simulator/engine"
)

func findChromium(t *testing.T) string {
	for _, c := range []string{os.Getenv("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"} {
		if c == "" {
			continue
		}
		if p, err := exec.LookPath(c); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no Chromium in CI (.ci/run installs Debian's chromium)")
	}
	t.Skip("no Chromium found (install Debian's chromium, or set CHROMIUM): the browser test did not run")
	return ""
}

// buildFolder builds the simulator from the current source into a fresh
// folder: the page, wasm_exec.js and the WebAssembly.
func buildFolder(t *testing.T) string {
	dir := t.TempDir()
	cmd := exec.Command("go", "run", "./build", "-o", dir)
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the simulator: %v\n%s", err, out)
	}
	// The files the build does not write (the page, its icon) as they are.
	for _, f := range simulator.Files {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("..", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestSimulatorInChromium(t *testing.T) {
	chromium := findChromium(t)
	srv := httptest.NewServer(simulator.Handler(os.DirFS(buildFolder(t))))
	defer srv.Close()

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.NoSandbox, // root in CI containers
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.WindowSize(1400, 1300),
		chromedp.UserDataDir(t.TempDir()),
	)
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()

	// Every console message, from the first load on: an uncaught exception
	// or a failed load (a 404) fails the test at the next checkpoint.
	msgs := &consoleLog{}
	cctx, stopConsole := context.WithCancel(ctx)
	defer stopConsole()
	messages := chromedp.Console(cctx)
	go msgs.collect(messages)
	checkpoint := 0
	consoleClean := func(what string) {
		t.Helper()
		checkpoint++
		mark := fmt.Sprintf("checkpoint %d", checkpoint)
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[any](fmt.Sprintf("console.log(%q)", mark))); err != nil {
			t.Fatal(err)
		}
		for bad := range msgs.until(t, mark) {
			t.Errorf("%s: the console has %s", what, bad)
		}
	}

	const seed = 42
	const buckets = 16
	pageErr := func(what string) {
		t.Helper()
		if msg, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#error"))); err == nil && msg != "" {
			t.Fatalf("%s: the page shows an error: %s", what, msg)
		}
	}
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		pageErr(what)
	}
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("reading %s: %v", sel, err)
		}
		return v
	}
	click := func(id string) chromedp.Action[chromedp.Void] { return chromedp.Click(chromedp.CSS("#" + id)) }
	set := func(id, v string) chromedp.Action[chromedp.Void] { return chromedp.SetValue(chromedp.CSS("#"+id), v) }

	do("load", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`#status[data-ready="1"]`)))
	consoleClean("load (the favicon included)")
	do("reset with a seed", set("seed", strconv.Itoa(seed)), set("buckets", strconv.Itoa(buckets)), set("every", "0"), click("reset"))

	// The same steps in Go, on the same configuration.
	sim, err := engine.New(seed, buckets, "heavykeeper", false)
	if err != nil {
		t.Fatal(err)
	}
	clk, sk := sim.Clock, sim.Sketch

	observe := func(key string) (est uint32, first bool) {
		t.Helper()
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[any](`document.getElementById("key").value = ""`)); err != nil {
			t.Fatal(err)
		}
		do("observe "+key, chromedp.SendKeys(chromedp.CSS("#key"), key), click("observe")) // typed, as a user would
		est, first = sk.Observe(key)
		gotEst, gotFirst := text("#result-est"), text("#result-first")
		if gotEst != strconv.Itoa(int(est)) || gotFirst != strconv.FormatBool(first) {
			t.Fatalf("Observe(%q): page shows (%s, %s) for %s, Go computes (%d, %v)", key, gotEst, gotFirst, text("#result-key"), est, first)
		}
		return est, first
	}
	tick := func(id string, n int) {
		t.Helper()
		do("advance "+id, click(id))
		clk.Advance(time.Duration(n) * engine.Tick)
	}
	ops := func() string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#trace li")].map(li => li.dataset.op)`))
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(v, ",")
	}
	words := func() []string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`epochsketch.state().words`))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	checkBucket := func(key string) {
		t.Helper()
		b, _, _ := sim.Locate(key)
		if shown := text("#bucket-index"); shown != strconv.Itoa(b) {
			t.Fatalf("page shows bucket %s, %q lives in %d", shown, key, b)
		}
		for i, w := range sim.Slots(b) {
			a, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(fmt.Sprintf("#slot-%d", i)), "data-word"))
			if err != nil {
				t.Fatal(err)
			}
			if a.Value != fmt.Sprintf("%016x", w) {
				t.Fatalf("bucket %d slot %d: page shows %s, Go holds %016x", b, i, a.Value, w)
			}
		}
	}

	if est, first := observe("alice"); est != 1 || !first {
		t.Fatalf("a new key reads (%d, %v)", est, first)
	}
	if got := ops(); got != "start,claim,result" {
		t.Errorf("a new key's trace is %s, want start,claim,result", got)
	}
	// The start names alice's home slot; her claim landed there, in the
	// page's trace and in Go's copy of the sketch.
	var home int
	start := text("#trace li:first-child")
	if i := strings.Index(start, "home slot "); i < 0 {
		t.Errorf("the start reads %q: it names no home slot", start)
	} else if _, err := fmt.Sscanf(start[i:], "home slot %d", &home); err != nil {
		t.Errorf("the start reads %q: %v", start, err)
	}
	if got, want := text("#trace li:nth-child(2)"), fmt.Sprintf("slot %d ", home); !strings.Contains(got, want) {
		t.Errorf("the claim reads %q, want it at %q", got, strings.TrimSpace(want))
	}
	if b, _, tag := sim.Locate("alice"); sim.Slots(b)[home]>>48 != uint64(tag) {
		t.Errorf("Go's sketch holds %016x in alice's home slot %d, want her fingerprint %04x", sim.Slots(b)[home], home, tag)
	}
	observe("alice")
	if got := ops(); got != "start,fast-refresh,result" {
		t.Errorf("a tracked key's trace is %s, want start,fast-refresh,result", got)
	}
	observe("alice")
	tick("tick1", 1)
	if est, first := observe("alice"); est != 3>>1+1 || !first {
		t.Fatalf("after a tick alice reads (%d, %v), want (2, true)", est, first)
	}
	tick("tick8", 8)
	observe("alice")
	checkBucket("alice")
	observe("bob")
	checkBucket("bob")

	// Automatic traffic, one step at a time: the page draws its keys from
	// the seeded engine, so Go replays the same keys.
	gen, err := engine.New(seed, buckets, "heavykeeper", false)
	if err != nil {
		t.Fatal(err)
	}
	do("choose the Zipf crowd", set("traffic", "zipf"))
	const steps = 400
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[any](fmt.Sprintf(`for (let i = 0; i < %d; i++) document.getElementById("step").click()`, steps))); err != nil {
		t.Fatal(err)
	}
	pageErr("step the traffic")
	var lastKey string
	for range steps {
		k, err := gen.NextKey("zipf", 0)
		if err != nil {
			t.Fatal(err)
		}
		sk.Observe(k)
		lastKey = k
	}
	checkBucket(lastKey)
	w := words()
	for b := range buckets {
		for i, x := range sim.Slots(b) {
			if w[b*8+i] != fmt.Sprintf("%016x", x) {
				t.Fatalf("after %d Zipf steps, bucket %d slot %d: page %s, Go %016x", steps, b, i, w[b*8+i], x)
			}
		}
	}
	if st := sk.Stats(); st.ChallengesLost+st.Evictions+st.Chips == 0 {
		t.Error("the Zipf steps never ran the lottery: the test does not cover Phase 3")
	}

	// The idle-key scenario: a whole wrap in a quiet bucket brings the old
	// count back (THEORY.md section 4); with a neighbour's write 30 ticks
	// in, the scrub clears it.
	do("the wrap scenario", set("seed", strconv.Itoa(seed)), click("reset"), set("traffic", "wrap"))
	sim2, err := engine.New(seed, buckets, "heavykeeper", false)
	if err != nil {
		t.Fatal(err)
	}
	sk2, clk2 := sim2.Sketch, sim2.Clock
	gen2, _ := engine.New(seed, buckets, "heavykeeper", false)
	stepWrap := func(n int) {
		t.Helper()
		for range n {
			do("a wrap step", click("step"))
		}
	}
	expect := func(what string, est uint32, first bool) {
		t.Helper()
		if got, gotFirst := text("#result-est"), text("#result-first"); got != strconv.Itoa(int(est)) || gotFirst != strconv.FormatBool(first) {
			t.Fatalf("%s: page shows (%s, %s), Go computes (%d, %v)", what, got, gotFirst, est, first)
		}
	}
	for range 5 {
		sk2.Observe("sleeper")
	}
	clk2.Advance(engine.WrapTicks * engine.Tick)
	stepWrap(7)
	est, first := sk2.Observe("sleeper")
	if est != 5+1 || first { // 2^24 ticks later the epoch matches again: age 0
		t.Fatalf("Go: the zombie reads %d", est)
	}
	expect("after a quiet wrap", est, first)
	if !strings.Contains(text("#scenario"), "zombie") {
		t.Errorf("the scenario does not name the zombie: %q", text("#scenario"))
	}
	sk2.Observe("sleeper")
	sk2.Observe("sleeper")
	clk2.Advance(30 * engine.Tick)
	b, _, _ := sim2.Locate("sleeper")
	nbr, err := gen2.NextKey("attack", b)
	if err != nil {
		t.Fatal(err)
	}
	sk2.Observe(nbr)
	clk2.Advance((engine.WrapTicks - 30) * engine.Tick)
	est, first = sk2.Observe("sleeper")
	stepWrap(7)
	if est != 1 || !first {
		t.Fatalf("Go: after a scrubbed wrap the sleeper reads (%d, %v)", est, first)
	}
	expect("after a wrap with a neighbour's write", est, first)
	if st := sk2.Stats(); st.ScrubbedZombies == 0 {
		t.Error("Go: no scrub counted")
	}

	// Play runs traffic until paused.
	do("play the mouse flood", set("traffic", "mice"), set("speed", "3"), click("play"))
	time.Sleep(500 * time.Millisecond)
	do("pause", click("play"))
	if k := text("#result-key"); !strings.Contains(k, "mouse-") {
		t.Errorf("after half a second of play the last key is %q, want a mouse", k)
	}

	// A bad seed is refused on the page, and the previous run stays.
	if err := chromedp.Do(ctx, set("seed", "zero"), click("reset")); err != nil {
		t.Fatal(err)
	}
	if msg := text("#error"); !strings.Contains(msg, `seed "zero"`) {
		t.Errorf("a bad seed shows %q, want an error naming it", msg)
	}
	before := words()
	if err := chromedp.Do(ctx, set("seed", "zero"), click("reset")); err != nil {
		t.Fatal(err)
	}
	if w := words(); strings.Join(w, ",") != strings.Join(before, ",") {
		t.Error("a refused reset changed the table")
	}
	consoleClean("a bad seed (a red message, not an exception)")

	do("one more step, a frame back in its trace", set("seed", strconv.Itoa(seed)), click("step"), click("prev"))
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	out := os.Getenv("SIMULATOR_SCREENSHOT")
	if out == "" {
		out = filepath.Join(t.TempDir(), "simulator.png")
	}
	if err := os.WriteFile(out, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", out, len(png))

	shot := func(name string) {
		t.Helper()
		dir := os.Getenv("SIMULATOR_SHOTS")
		if dir == "" {
			return
		}
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatalf("SIMULATOR_SHOTS: %v", err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
			t.Fatalf("SIMULATOR_SHOTS: %v", err)
		}
	}
	// The layout at 1,400 px: no frame button wraps, and no key, however
	// long, widens the page or reaches into the right-hand column.
	layout := func(what string) {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](`(() => {
			const r = (sel) => document.querySelector(sel).getBoundingClientRect();
			const lh = (sel) => parseFloat(getComputedStyle(document.querySelector(sel)).lineHeight);
			const left = r("main > div:first-child"), right = r("main > div:last-child");
			return [document.documentElement.scrollWidth, innerWidth, left.right, right.left,
				r("#prev").height, r("#next").height, lh("#prev"), r("#prev").top, r("#next").top];
		})()`))
		if err != nil {
			t.Fatal(err)
		}
		if scroll, inner := v[0], v[1]; scroll > inner {
			t.Errorf("%s: the page is %v px wide in a %v px window", what, scroll, inner)
		}
		if v[2] > v[3] {
			t.Errorf("%s: the left column ends at %v px, over the right one at %v px", what, v[2], v[3])
		}
		if v[4] >= 2*v[6] || v[5] >= 2*v[6] || v[7] != v[8] {
			t.Errorf("%s: the frame buttons wrap (heights %v and %v px for a %v px line, tops %v and %v)", what, v[4], v[5], v[6], v[7], v[8])
		}
	}
	layout("the first screen")
	for _, n := range []int{300, 5000} {
		key := strings.Repeat("k", n)
		// Typed (300) or pasted (5,000), as a user would.
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[any](`document.getElementById("key").value = ""`)); err != nil {
			t.Fatal(err)
		}
		if n <= 300 {
			do(fmt.Sprint("type a key of ", n), chromedp.SendKeys(chromedp.CSS("#key"), key), click("observe"))
		} else {
			do(fmt.Sprint("paste a key of ", n), set("key", key), click("observe"))
		}
		if est := text("#result-est"); est != "1" {
			t.Errorf("a key of %d characters reads %s", n, est)
		}
		if shown := text("#result-key"); len(shown) > 200 || !strings.Contains(shown, fmt.Sprintf("(%d characters)", n)) {
			t.Errorf("a key of %d characters is shown as %d characters: %.80q", n, len(shown), shown)
		}
		layout(fmt.Sprintf("a key of %d characters", n))
		do(fmt.Sprint("watch a key of ", n), set("watch", key))
		layout(fmt.Sprintf("watching a key of %d characters", n))
		shot(fmt.Sprint("key-", n))
	}

	// Each pattern's plot follows a key the pattern moves: the Zipf
	// crowd's heaviest user, the elephant, and under the attack the watched
	// key, whose bucket it aims at and whose own traffic runs beside it.
	for _, c := range []struct{ pattern, watch, want string }{
		{"zipf", "", "user-0"},
		{"elephant", "", "elephant"},
		{"attack", "alice", "alice"},
	} {
		do("reset for "+c.pattern, set("seed", strconv.Itoa(seed)), click("reset"))
		if c.watch != "" {
			do("watch "+c.watch, set("watch", c.watch))
		}
		do("choose "+c.pattern, set("traffic", c.pattern))
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[any](`for (let i = 0; i < 200; i++) document.getElementById("step").click()`)); err != nil {
			t.Fatal(err)
		}
		pageErr(c.pattern)
		if got := text("#watch-now"); got == "" {
			t.Fatalf("%s: no watched estimate", c.pattern)
		}
		watched, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("watch").value`))
		if err != nil {
			t.Fatal(err)
		}
		v, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](`[plot.length, Math.max(...plot.map((p) => p.estimate)), Math.max(...plot.map((p) => p.exact))]`))
		if err != nil {
			t.Fatal(err)
		}
		if watched != c.want || v[0] < 200 || v[1] < 10 || v[2] < 10 {
			t.Errorf("%s: the plot follows %q (want %s): %v samples, estimate up to %v, exact up to %v", c.pattern, watched, c.want, v[0], v[1], v[2])
		}
		shot("pattern-" + c.pattern)
	}
	consoleClean("the long keys and the patterns")
}

// consoleLog collects the page's console messages.
type consoleLog struct {
	mu   sync.Mutex
	msgs []chromedp.ConsoleMessage
	err  error
}

func (l *consoleLog) collect(messages iter.Seq2[chromedp.ConsoleMessage, error]) {
	for m, err := range messages {
		l.mu.Lock()
		if err != nil {
			l.err = err
			l.mu.Unlock()
			return
		}
		l.msgs = append(l.msgs, m)
		l.mu.Unlock()
	}
}

// until waits for the log message mark and returns the exceptions and
// errors logged before it since the last call.
func (l *consoleLog) until(t *testing.T, mark string) iter.Seq[string] {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l.mu.Lock()
		i := slices.IndexFunc(l.msgs, func(m chromedp.ConsoleMessage) bool { return m.Text == mark })
		if i >= 0 {
			before := l.msgs[:i]
			l.msgs = l.msgs[i+1:]
			l.mu.Unlock()
			return func(yield func(string) bool) {
				for _, m := range before {
					if (m.IsException() || m.Type == chromedp.ConsoleError) && !yield(m.String()) {
						return
					}
				}
			}
		}
		err := l.err
		l.mu.Unlock()
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("the console never showed %q (%v)", mark, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
