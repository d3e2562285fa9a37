package sketchproxy

import (
	"bytes"
	"log/slog"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Refusals from many goroutines, over several intervals and two rules: the
// lines logged whole and the counts on the closing lines add up to every
// refusal, whatever the interleaving (run under -race), and Close's flush
// leaves no count behind.
func TestRefusalLogAddsUp(t *testing.T) {
	var buf syncBuffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var l refusalLog
	const goroutines, each = 8, 2000
	var whole [2]int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rule := []string{"a", "b"}[g%2]
			for i := range each {
				if l.first(rule, false, 5*time.Millisecond, log) {
					mu.Lock()
					whole[g%2]++
					mu.Unlock()
				}
				if i%500 == 0 {
					time.Sleep(7 * time.Millisecond) // pace the flood, so that intervals close during it
				}
			}
		}()
	}
	wg.Wait()
	l.flush(log)
	counted := map[string]int64{}
	for _, m := range regexp.MustCompile(`rule=(\w) shadow=false more_refusals=(\d+)`).FindAllStringSubmatch(buf.String(), -1) {
		n, _ := strconv.ParseInt(m[2], 10, 64)
		counted[m[1]] += n
	}
	for i, rule := range []string{"a", "b"} {
		if got := whole[i] + counted[rule]; got != goroutines/2*each {
			t.Errorf("rule %s: %d whole + %d counted = %d, want %d", rule, whole[i], counted[rule], got, goroutines/2*each)
		}
		if whole[i] < 1 || whole[i] > goroutines/2*each/10 {
			t.Errorf("rule %s: %d refusals logged whole, want a few (one per interval)", rule, whole[i])
		}
	}
	if !bytes.Contains([]byte(buf.String()), []byte("more_refusals=")) {
		t.Errorf("no summary line: %s", buf.String())
	}
}
