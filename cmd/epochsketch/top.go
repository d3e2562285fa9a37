package main

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/epochsketch/epochsketch"
)

// topOptions are the flags of `epochsketch top`.
type topOptions struct {
	k, buckets   int
	tick         time.Duration
	linesPerTick int
	every        int
	format       string
	asJSON       bool
	key, field   string
	timeField    string
	live         bool
	showBad      bool
}

// runTop reads keys, one per line, from files (gzip too) or standard input,
// and reports the heaviest recent keys: at every -every lines (a checkpoint)
// and at the end. Time is the wall clock, or, with -lines-per-tick N, a replay
// clock that advances one tick every N lines, so a replayed stream decays as
// it happened.
func runTop(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("top", flag.ContinueOnError)
	var o topOptions
	fs.IntVar(&o.k, "k", 20, "how many keys to report")
	fs.IntVar(&o.buckets, "buckets", epochsketch.DefaultNumBuckets, "sketch size in 64-byte buckets")
	fs.DurationVar(&o.tick, "tick", time.Second, "tick (half-life)")
	fs.IntVar(&o.linesPerTick, "lines-per-tick", 0, "replay: advance one tick every N lines (0: the wall clock)")
	fs.IntVar(&o.every, "every", 0, "report a checkpoint every N lines (0: only at the end)")
	fs.StringVar(&o.format, "format", "lines", "input format: lines (one key per line), clf or combined (access logs), json (JSON lines)")
	fs.StringVar(&o.key, "key", "ip", "access logs: the key: ip, path, method+path, ua or ip+path")
	fs.StringVar(&o.field, "field", "", "json: the key's field path, e.g. user.id")
	fs.StringVar(&o.timeField, "time-field", "", "json: the time's field path (RFC 3339 or Unix seconds)")
	fs.BoolVar(&o.live, "live", false, "use the wall clock even when records carry times (tail -f)")
	fs.BoolVar(&o.showBad, "show-malformed", false, "print each malformed line's number and reason to standard error")
	fs.BoolVar(&o.asJSON, "json", false, "write each report as one JSON object per line")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageErr("%v", err)
	}
	parse, err := newParser(o.format, o.key, o.field, o.timeField)
	if err != nil {
		return err
	}
	timed := (o.format == "clf" || o.format == "combined" || o.timeField != "") && !o.live
	switch {
	case o.k < 1:
		return usageErr("-k must be at least 1, got %d", o.k)
	case o.linesPerTick < 0 || o.every < 0:
		return usageErr("-lines-per-tick and -every must not be negative")
	}
	cfg := epochsketch.Config{NumBuckets: o.buckets, TickDuration: o.tick}
	var clk *epochsketch.ManualClock
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	switch {
	case timed:
		// Records carry their own times: the sketch's time follows them
		// (ObserveAt), so a replayed log decays as it happened.
		cfg.Clock = epochsketch.NewManualClock(time.Unix(0, 0))
	case o.linesPerTick > 0:
		clk = epochsketch.NewManualClock(start)
		cfg.Clock = clk
	}
	if err := cfg.Validate(); err != nil {
		return usageErr("%v", err)
	}
	sk := epochsketch.New(cfg)
	defer sk.Close()
	// Track 4k keys and report the best k by their current estimates: a
	// TopK entry may lag its key by up to 1/16, never by a whole rank.
	top := epochsketch.NewTopK(4 * o.k)
	st := &topState{o: o, sk: sk, top: top, out: stdout, errw: stderr, parse: parse, timed: timed}

	files := fs.Args()
	if len(files) == 0 {
		files = []string{"-"}
	}
	for _, name := range files {
		if err := st.readFile(name, stdin, clk); err != nil {
			return err
		}
	}
	st.report(true)
	return nil
}

type topState struct {
	o                               topOptions
	sk                              *epochsketch.Sketch
	top                             *epochsketch.TopK
	out, errw                       io.Writer
	parse                           parser
	timed                           bool
	lines, empty, malformed, firsts int
}

func (st *topState) readFile(name string, stdin io.Reader, clk *epochsketch.ManualClock) error {
	var r io.Reader = stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return err // *PathError names the file
		}
		defer f.Close()
		r = f
	}
	br := bufio.NewReaderSize(r, 1<<16)
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		defer zr.Close()
		br = bufio.NewReaderSize(zr, 1<<16)
	}
	sc := bufio.NewScanner(br)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		st.lines++
		r, err := st.parse(sc.Bytes())
		switch {
		case errors.Is(err, errEmpty):
			st.empty++
		case err != nil:
			// A malformed line is counted and never stops the run.
			st.malformed++
			if st.o.showBad {
				fmt.Fprintf(st.errw, "%s:%d: malformed: %v\n", name, st.lines, err)
			}
		default:
			var est uint32
			var first bool
			if st.timed && !r.when.IsZero() {
				est, first = st.sk.ObserveAt(r.when, string(r.key))
			} else {
				est, first = st.sk.ObserveBytes(r.key)
			}
			if first {
				st.firsts++
			}
			st.top.OfferBytes(r.key, est)
		}
		if clk != nil && st.lines%st.o.linesPerTick == 0 {
			clk.Advance(st.o.tick)
		}
		if st.o.every > 0 && st.lines%st.o.every == 0 {
			st.report(false)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: line %d: %w", name, st.lines+1, err)
	}
	return nil
}

// Report is one checkpoint, as -json writes it.
type Report struct {
	Lines     int                    `json:"lines"`
	Empty     int                    `json:"empty_lines"`
	Malformed int                    `json:"malformed_lines"`
	Firsts    int                    `json:"first_sightings"`
	Final     bool                   `json:"final"`
	Top       []epochsketch.TopEntry `json:"top"`
	Stats     epochsketch.Stats      `json:"stats"`
	MemBytes  int                    `json:"memory_bytes"`
}

func (st *topState) report(final bool) {
	entries := st.top.List()
	for i := range entries {
		entries[i].Estimate = st.sk.Estimate(entries[i].Key)
	}
	sort.Slice(entries, func(i, j int) bool {
		if entries[i].Estimate != entries[j].Estimate {
			return entries[i].Estimate > entries[j].Estimate
		}
		return entries[i].Key < entries[j].Key
	})
	for len(entries) > 0 && entries[len(entries)-1].Estimate == 0 {
		entries = entries[:len(entries)-1]
	}
	entries = entries[:min(st.o.k, len(entries))]
	r := Report{Lines: st.lines, Empty: st.empty, Malformed: st.malformed, Firsts: st.firsts, Final: final, Top: entries,
		Stats: st.sk.Stats(), MemBytes: st.sk.NumBuckets() * 64}
	if st.o.asJSON {
		b, _ := json.Marshal(r)
		fmt.Fprintf(st.out, "%s\n", b)
		return
	}
	label := "checkpoint"
	if final {
		label = "final"
	}
	fmt.Fprintf(st.out, "%s after %d lines (%d empty, %d malformed, %d first sightings), %s of sketch\n", label, r.Lines, r.Empty, r.Malformed, r.Firsts, formatBytes(r.MemBytes))
	w := tabwriter.NewWriter(st.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "rank\tkey\testimate")
	for i, e := range entries {
		fmt.Fprintf(w, "%d\t%s\t%d\n", i+1, e.Key, e.Estimate)
	}
	w.Flush()
	fmt.Fprintln(st.out)
}
