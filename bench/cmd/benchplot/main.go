// Command benchplot draws BENCHMARKS.md's peer charts from the raw
// `go test -bench` files in bench/peers: ns/op by peer for each workload,
// the live heap after 10M keys, and throughput against cores. Medians of the
// runs in each file; SVG into bench/peers/plots (scripts/bench.sh converts
// them to PNG).
package main

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/epochsketch/epochsketch/internal/plot"
)

// line matches "BenchmarkX/workload=W/impl=I[-P]  N  V ns/op ..." (or
// keys=K in place of workload=W).
var line = regexp.MustCompile(`^Benchmark\w+/(?:(?:workload|keys)=([^/\s]+)/)?impl=(\S+?)(?:-(\d+))?\s+\d+\s+(.*)$`)

type key struct{ workload, impl, procs string }

// read returns every sample of unit per (workload, impl, procs), in file order
// of first appearance.
func read(path, unit string) (map[key][]float64, []key, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	vals := map[key][]float64{}
	var order []key
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		procs := m[3]
		if procs == "" {
			procs = "1"
		}
		k := key{m[1], m[2], procs}
		fields := strings.Fields(m[4])
		for i := 1; i < len(fields); i++ {
			if fields[i] == unit {
				v, err := strconv.ParseFloat(fields[i-1], 64)
				if err != nil {
					return nil, nil, fmt.Errorf("%s: %q: %w", path, sc.Text(), err)
				}
				if _, ok := vals[k]; !ok {
					order = append(order, k)
				}
				vals[k] = append(vals[k], v)
			}
		}
	}
	return vals, order, sc.Err()
}

func median(s []float64) float64 {
	x := append([]float64(nil), s...)
	sort.Float64s(x)
	if len(x)%2 == 1 {
		return x[len(x)/2]
	}
	return (x[len(x)/2-1] + x[len(x)/2]) / 2
}

func main() {
	if err := run("peers"); err != nil {
		fmt.Fprintln(os.Stderr, "benchplot:", err)
		os.Exit(1)
	}
}

func run(dir string) error {
	out := filepath.Join(dir, "plots")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	write := func(name, svg string) error { return os.WriteFile(filepath.Join(out, name+".svg"), []byte(svg), 0o644) }

	single, order, err := read(filepath.Join(dir, "single.txt"), "ns/op")
	if err != nil {
		return err
	}
	byWorkload := map[string][]plot.Bar{}
	var workloads []string
	for _, k := range order {
		if _, ok := byWorkload[k.workload]; !ok {
			workloads = append(workloads, k.workload)
		}
		byWorkload[k.workload] = append(byWorkload[k.workload], plot.Bar{Label: k.impl, Value: median(single[k])})
	}
	for _, w := range workloads {
		if err := write("ns-"+w, plot.BarsLog("ns per call, single-threaded: "+w, "ns/op (log scale), median of 6", byWorkload[w])); err != nil {
			return err
		}
	}

	heap, horder, err := read(filepath.Join(dir, "liveheap.txt"), "live-MiB")
	if err != nil {
		return err
	}
	var hb []plot.Bar
	var hs []plot.Series
	idx := map[string]int{}
	for _, k := range horder {
		v := median(heap[k])
		if k.workload == "10000000" {
			hb = append(hb, plot.Bar{Label: k.impl, Value: v})
		}
		n, _ := strconv.ParseFloat(k.workload, 64)
		i, ok := idx[k.impl]
		if !ok {
			i = len(hs)
			idx[k.impl] = i
			hs = append(hs, plot.Series{Name: k.impl})
		}
		hs[i].Points = append(hs[i].Points, [2]float64{math.Log10(n), math.Log10(max(v, 0.01))})
	}
	if err := write("liveheap", plot.BarsLog("live heap after 10M distinct keys", "MiB (log scale)", hb)); err != nil {
		return err
	}
	if err := write("liveheap-keys", plot.LinePlot("live heap against distinct keys", "log10 distinct keys", "log10 MiB", hs)); err != nil {
		return err
	}

	par, porder, err := read(filepath.Join(dir, "parallel.txt"), "ns/op")
	if err != nil {
		return err
	}
	for _, w := range []string{"zipf1.1-1M", "disjoint", "hot"} {
		var series []plot.Series
		seen := map[string]bool{}
		for _, k := range porder {
			if k.workload != w || seen[k.impl] {
				continue
			}
			seen[k.impl] = true
			s := plot.Series{Name: k.impl}
			for _, p := range []string{"1", "2"} {
				if v, ok := par[key{w, k.impl, p}]; ok {
					cores, _ := strconv.Atoi(p)
					s.Points = append(s.Points, [2]float64{float64(cores), 1e3 / median(v)}) // millions of calls per second
				}
			}
			series = append(series, s)
		}
		if err := write("cores-"+w, plot.LinePlot("throughput against cores: "+w, "cores (GOMAXPROCS)", "million calls per second", series)); err != nil {
			return err
		}
	}
	return nil
}
