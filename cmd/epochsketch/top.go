package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/epochsketch/epochsketch"
)

// topOptions are the flags of `epochsketch top`.
type topOptions struct {
	k, buckets   int
	seed         uint64
	tick         time.Duration
	linesPerTick int
	every        int
	format       string
	asJSON       bool
	key, field   string
	timeField    string
	timeFormat   string
	live         bool
	showBad      bool
	firsts       bool
	progress     string
	refresh      time.Duration
	state        string
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
	fs.Uint64Var(&o.seed, "seed", 0, "seed of the sketch's hash and lottery (0: random; a seed makes runs at tiny -buckets repeatable)")
	fs.IntVar(&o.buckets, "buckets", epochsketch.DefaultNumBuckets, "sketch size in 64-byte buckets")
	fs.DurationVar(&o.tick, "tick", time.Second, "tick (half-life): a count halves every tick and reads 0 after about 24 silent ticks. Records with times and no -tick: the span of the files' times, rounded up (1h, 6h, 24h, 7 days...), said on standard error")
	fs.IntVar(&o.linesPerTick, "lines-per-tick", 0, "replay: advance one tick every N lines (0: the wall clock)")
	fs.IntVar(&o.every, "every", 0, "report a checkpoint every N lines (0: only at the end)")
	fs.StringVar(&o.format, "format", "lines", "input format: lines (one key per line), clf or combined (access logs), json (JSON lines)")
	fs.StringVar(&o.key, "key", "ip", "access logs: the key: ip, path (without the query), uri (with it), method+path, ua (combined) or ip+path")
	fs.StringVar(&o.field, "field", "", "json: the key's field path, e.g. user.id")
	fs.StringVar(&o.timeField, "time-field", "", "json: the time's field path (RFC 3339, or Unix seconds, ms, µs or ns, told by magnitude)")
	fs.StringVar(&o.timeFormat, "time-format", "", "access logs and json: the records' time `layout`, in Go's form (e.g. \"02/Jan/2006 15:04:05\" for Python's http.server; UTC without a zone)")
	fs.BoolVar(&o.live, "live", false, "decay by the wall clock (tail -f): without it, records without times do not decay (or by -lines-per-tick), and records with times decay by them")
	fs.BoolVar(&o.showBad, "show-malformed", false, "print each malformed line's number and reason to standard error")
	fs.BoolVar(&o.asJSON, "json", false, "write each report as one JSON object per line")
	fs.BoolVar(&o.firsts, "firsts", false, "print each first sighting (key and line) to standard error")
	fs.StringVar(&o.state, "state", "", "resume from this state `file` if it exists, and save to it at the end (and on Ctrl-C, SIGTERM or a closed output); a file read before goes on from where it was left, and one that changed otherwise is refused")
	fs.StringVar(&o.progress, "progress", "auto", "progress line with rate and ETA when reading files: auto (when standard error is a terminal), on, off")
	fs.DurationVar(&o.refresh, "refresh", 0, "report this often: redrawn in place on a terminal, else appended (one JSON line each with -json) (default 1s on a terminal or with -live, else 0: only -every and the end)")
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp(fs, stderr)
			return err
		}
		return usageErr("%v", err)
	}
	// A flag the format ignores is a mistake, not a no-op.
	var misplaced error
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) {
		set[f.Name] = true
		switch {
		case misplaced != nil:
		case (f.Name == "field" || f.Name == "time-field") && o.format != "json":
			misplaced = usageErr("-%s applies to -format json, not %s", f.Name, o.format)
		case f.Name == "key" && o.format != "clf" && o.format != "combined":
			misplaced = usageErr("-key applies to -format clf or combined, not %s", o.format)
		case f.Name == "time-format" && o.format == "lines":
			misplaced = usageErr("-time-format applies to records with times (-format clf, combined, or json with -time-field)")
		}
	})
	if misplaced != nil {
		return misplaced
	}
	parse, err := newParser(o.format, o.key, o.field, o.timeField, o.timeFormat)
	if err != nil {
		return err
	}
	timed := (o.format == "clf" || o.format == "combined" || o.timeField != "") && !o.live
	if !set["refresh"] && (o.live || isTerminal(os.Stdout)) {
		// A live tail reports as it goes, to a terminal or a pipe
		// (tail -f access.log | epochsketch top -live | tee top.log).
		o.refresh = time.Second
	}
	switch {
	case o.k < 1 || o.k > maxK:
		return usageErr("-k %d: want 1 to %d (the report keeps 4k keys of up to %d bytes each)", o.k, maxK, maxKeyLen)
	case o.linesPerTick < 0 || o.every < 0 || o.refresh < 0:
		return usageErr("-lines-per-tick, -every and -refresh must not be negative")
	case o.progress != "auto" && o.progress != "on" && o.progress != "off":
		return usageErr("-progress %q: want auto, on or off", o.progress)
	}
	cfg := epochsketch.Config{NumBuckets: o.buckets, Seed: o.seed}
	if o.state != "" {
		cfg.Hash = epochsketch.HashSipHash13 // a key that can be saved (maphash's cannot)
	}
	var clk *epochsketch.ManualClock
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	switch {
	case timed:
		// Records carry their own times: the sketch's time follows them
		// (ObserveN with the record's time), so a replayed log decays as it happened.
		cfg.Clock = epochsketch.NewManualClock(time.Unix(0, 0))
	case o.linesPerTick > 0:
		clk = epochsketch.NewManualClock(start)
		cfg.Clock = clk
	case !o.live:
		// Records without times, and no -live: the same input always
		// gives the same answer, whatever the machine's speed. No decay.
		cfg.Clock = epochsketch.NewManualClock(start)
	}
	files := fs.Args()
	if len(files) == 0 {
		files = []string{"-"}
	}
	var chosen bool // the tick was chosen from the records' span
	if timed && !set["tick"] {
		if m, ok := savedMeta(o.state); ok {
			o.tick = m.Tick // resumed: the state's own tick
		} else if span, ok := filesSpan(files, parse); ok {
			o.tick, chosen = spanTick(span.lo, span.hi), true
			fmt.Fprintf(stderr, "epochsketch top: the records span %s: -tick %s, one tick that holds them all, so that every record counts whole (give a shorter -tick to weigh the latest more)\n",
				span, tickFlag(o.tick))
		}
	}
	cfg.TickDuration = o.tick
	if err := cfg.Validate(); err != nil {
		return usageErr("%v", err)
	}
	sk := epochsketch.New(cfg)
	defer sk.Close()
	// Track 4k keys and report the best k by their current estimates: a
	// TopK entry may lag its key by up to 1/16, never by a whole rank.
	top := epochsketch.NewTopK(4 * o.k)
	st := &topState{o: o, sk: sk, top: top, out: stdout, errw: stderr, parse: parse, timed: timed,
		seen: map[string]time.Time{}, prev: map[string]uint32{}, marks: map[string]*fileMark{}}

	if o.state != "" {
		resumed, err := loadState(o.state, st, clk)
		if err != nil {
			return err
		}
		if resumed {
			fmt.Fprintf(stderr, "resumed from %s after %s\n", o.state, plural(st.lines, "line"))
		}
	}
	if o.progress == "on" || o.progress == "auto" && isTerminal(os.Stderr) {
		st.prog = newProgress(files, stderr)
	}
	// Ctrl-C ends the run with the final summary.
	ctx, stop := signal.NotifyContext(context.Background(), stopSignals...)
	defer stop()
	// A file that cannot be read, or breaks off (a truncated gzip), is
	// reported and the others are read: the report covers what was read,
	// and the exit status says that something was not.
	var failed []string
	for _, name := range files {
		if err := st.readFile(ctx, name, stdin, clk); err != nil {
			fmt.Fprintf(stderr, "epochsketch top: %v (the report covers the rest)\n", err)
			failed = append(failed, name)
		}
		if ctx.Err() != nil {
			break
		}
	}
	if st.prog != nil {
		st.prog.done()
	}
	st.report(true)
	if timed && !set["tick"] && !chosen && st.span.span() > 16*o.tick {
		// Standard input cannot be scanned ahead for its span: say what
		// the report covers and which flag covers the whole input.
		fmt.Fprintf(stderr, "epochsketch top: the records span %s, but with -tick %s a count halves every %s and reads 0 after about 24 of them: the report shows the last %s or so. For the whole span, run again with -tick %s\n",
			st.span, tickFlag(o.tick), tickFlag(o.tick), formatDuration(24*o.tick), tickFlag(spanTick(st.span.lo, st.span.hi)))
	}
	if o.state != "" {
		if err := saveState(o.state, st, clk); err != nil {
			return fmt.Errorf("saving -state %s: %w", o.state, err)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d inputs could not be read to the end: %s", len(failed), len(files), strings.Join(failed, ", "))
	}
	if st.malformed > 0 && st.malformed == st.lines-st.empty {
		which := fmt.Sprintf("all %d non-empty lines were malformed; the first", st.malformed)
		if st.malformed == 1 {
			which = "the only non-empty line was malformed"
		}
		return fmt.Errorf("%s, %s: check -format and -key, -time-format for its times, or see each with -show-malformed", which, st.firstBad)
	}
	return nil
}

// maxK caps -k: the TopK keeps 4k keys.
const maxK = 10_000

// maxKeyLen caps a key: longer keys are counted by their first maxKeyLen
// bytes and shown as cut, so that a stream of huge lines cannot grow the
// tool's memory (the TopK keeps 4k keys).
const maxKeyLen = 1024

// maxLine is the longest line read whole; a longer one is skipped and
// counted as malformed.
const maxLine = 1 << 20

// displayKey is a key as the table shows it: as is when it is printable
// text, else quoted with Go's escapes, so that no control byte (an ESC that
// recolors the terminal, a tab that shifts the columns) reaches the
// terminal; "…[cut]" marks a key cut at maxKeyLen bytes.
func displayKey(k string) string {
	cut := len(k) >= maxKeyLen
	safe := utf8.ValidString(k)
	for _, r := range k {
		if !safe || !unicode.IsPrint(r) || r == '"' && strings.HasPrefix(k, `"`) {
			safe = false
			break
		}
	}
	if !safe {
		k = strconv.Quote(k)
	}
	if cut {
		k += "…[cut]"
	}
	return k
}

// trend says how an estimate moved since the previous report.
func trend(prev, now uint32) string {
	switch {
	case prev == 0:
		return "new"
	case now > prev:
		return fmt.Sprintf("+%d", now-prev)
	case now < prev:
		return fmt.Sprintf("-%d", prev-now)
	}
	return "="
}

// plural writes a count of things: "1 line", "2 lines".
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return strconv.Itoa(n) + " " + thing + "s"
}

// tickFlag writes a tick as -tick takes it, without zero units: 24h, 10m.
func tickFlag(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

type topState struct {
	o                               topOptions
	sk                              *epochsketch.Sketch
	top                             *epochsketch.TopK
	out, errw                       io.Writer
	parse                           parser
	timed                           bool
	lines, empty, malformed, firsts int
	firstBad                        string // the first malformed line's place and reason
	prog                            *progress
	now                             time.Time // the latest record's time, or the wall clock's
	span                            timeSpan  // the records' earliest and latest times
	reports                         int       // reports written so far
	seen                            map[string]time.Time
	prev                            map[string]uint32
	marks                           map[string]*fileMark // where each file read stands, for -state
	order                           []string             // the files in the order read
}

func (st *topState) readFile(ctx context.Context, name string, stdin io.Reader, clk *epochsketch.ManualClock) error {
	var r io.Reader = stdin
	var mark *fileMark // where this file stands (files only: standard input has no position)
	var skip int64
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return err // *PathError names the file
		}
		defer f.Close()
		r = f
		id, err := identify(f)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		mark = st.marks[name]
		switch {
		case id.Size < 0:
			mark = nil // a pipe or a device: read as it comes, like standard input
		case mark != nil:
			// Resumed: the file must be the one read before, perhaps grown.
			if id.Size < mark.Size || !id.sameHead(mark) {
				return fmt.Errorf("%s changed since -state was saved (it had %d bytes beginning with sha256 %.16s…, it has %d bytes): resume it with a new state file, or delete the state to start again",
					name, mark.Size, mark.Head, id.Size)
			}
			skip = mark.Offset
		default:
			mark = &fileMark{Name: name}
			st.marks[name] = mark
			st.order = append(st.order, name)
		}
		if mark != nil {
			mark.Size, mark.Head, mark.HeadLen = id.Size, id.Head, id.HeadLen
		}
	}
	if st.prog != nil {
		r = st.prog.wrap(r)
	}
	// Lines come from a reader goroutine in batches, so that Ctrl-C and the
	// refresh ticker are heard even while a read blocks (tail -f), the
	// first one included: telling gzip by its magic waits for two bytes.
	batches := make(chan []readRecord, 4)
	errc := make(chan error, 1)
	go func() {
		defer close(batches)
		br := bufio.NewReaderSize(r, 1<<16)
		if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
			zr, err := gzip.NewReader(br)
			if err != nil {
				errc <- err
				return
			}
			defer zr.Close()
			br = bufio.NewReaderSize(zr, 1<<16)
		}
		if skip > 0 {
			// Resumed: the lines before the saved position were counted.
			if n, err := io.CopyN(io.Discard, br, skip); err != nil {
				errc <- fmt.Errorf("resuming at byte %d: the input has only %d: %w", skip, n, err)
				return
			}
		}
		var batch []readRecord
		var err error
		size := 0 // the batch's bytes: at most 1024 lines and about 4 MiB
		for {
			var line []byte
			var n int
			if line, n, err = readLine(br); n == 0 && err != nil {
				break
			}
			batch = append(batch, readRecord{line, n}) // nil line: one over maxLine
			if size += len(line); len(batch) == 1024 || size >= 4<<20 || br.Buffered() == 0 {
				size = 0
				select {
				case batches <- batch:
				case <-ctx.Done():
					return
				}
				batch = nil
			}
		}
		if len(batch) > 0 {
			select {
			case batches <- batch:
			case <-ctx.Done():
			}
		}
		if err == io.EOF {
			err = nil
		}
		errc <- err
	}()
	var tick <-chan time.Time
	if st.o.refresh > 0 {
		t := time.NewTicker(st.o.refresh)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
			st.redraw()
		case batch, ok := <-batches:
			if !ok {
				select {
				case err := <-errc:
					if err != nil {
						return fmt.Errorf("%s: after line %d: %w", name, st.lines, err)
					}
				default:
				}
				return nil
			}
			for _, rec := range batch {
				st.line(name, rec.line, clk)
				if mark != nil {
					mark.Offset += int64(rec.n)
				}
			}
			if st.prog != nil {
				st.prog.show()
			}
		}
	}
}

// line handles one input line.
func (st *topState) line(name string, line []byte, clk *epochsketch.ManualClock) {
	st.lines++
	r, err := st.parse(line)
	if line == nil {
		err = fmt.Errorf("longer than %d bytes: skipped", maxLine)
	}
	if err == nil && len(r.key) > maxKeyLen {
		r.key = r.key[:maxKeyLen] // counted and shown by its first maxKeyLen bytes
	}
	switch {
	case errors.Is(err, errEmpty):
		st.empty++
	case err != nil:
		// A malformed line is counted and never stops the run.
		st.malformed++
		if st.firstBad == "" {
			st.firstBad = fmt.Sprintf("%s:%d, %v", name, st.lines, err)
		}
		if st.o.showBad {
			fmt.Fprintf(st.errw, "%s:%d: malformed: %v\n", name, st.lines, err)
		}
	default:
		var est uint32
		var first bool
		if st.timed && !r.when.IsZero() {
			est, first = st.sk.ObserveN(r.when, string(r.key), 1)
			if r.when.After(st.now) {
				st.now = r.when
			}
			st.span.add(r.when)
		} else {
			est, first = st.sk.ObserveBytes(r.key)
		}
		if first {
			st.firsts++
			if st.o.firsts {
				fmt.Fprintf(st.errw, "first sighting: %s (line %d)\n", displayKey(string(r.key)), st.lines)
			}
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

// redraw repaints the table in place on a terminal, or appends a report.
func (st *topState) redraw() {
	if !st.o.asJSON && isTerminal(os.Stdout) && st.out == io.Writer(os.Stdout) {
		fmt.Fprint(st.out, "\x1b[H\x1b[2J")
	}
	st.report(false)
}

// Entry is one reported key: its estimate now, since when it has been in the
// reported top (record time in replays; the tool keeps no per-key history
// beyond the reported keys, so this is not the key's first sighting), and its
// estimate at the previous report (0: not in it). A one-shot report (the
// final report of a run that wrote no other) has neither: there is no
// earlier report to compare with.
type Entry struct {
	Key        string    `json:"key"`
	Estimate   uint32    `json:"estimate"`
	InTopSince time.Time `json:"in_top_since,omitzero"` // absent without record or wall times
	Previous   *uint32   `json:"previous,omitempty"`
}

// Report is one checkpoint, as -json writes it.
type Report struct {
	Lines     int               `json:"lines"`
	Empty     int               `json:"empty_lines"`
	Malformed int               `json:"malformed_lines"`
	Firsts    int               `json:"first_sightings"`
	Final     bool              `json:"final"`
	Top       []Entry           `json:"top"`
	Stats     epochsketch.Stats `json:"stats"`
	MemBytes  int               `json:"memory_bytes"`
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
	now := st.now
	if !st.timed {
		now = time.Time{} // records without times have no time to show
		if st.o.live {
			now = time.Now()
		}
	}
	oneShot := final && st.reports == 0
	st.reports++
	top := make([]Entry, len(entries))
	prev := map[string]uint32{}
	for i, e := range entries {
		if _, ok := st.seen[e.Key]; !ok {
			st.seen[e.Key] = now
		}
		top[i] = Entry{Key: e.Key, Estimate: e.Estimate}
		if !oneShot {
			p := st.prev[e.Key]
			top[i].InTopSince, top[i].Previous = st.seen[e.Key], &p
		}
		prev[e.Key] = e.Estimate
	}
	st.prev = prev
	// Keep first-seen times only for keys still reported: memory stays bounded.
	for k := range st.seen {
		if _, ok := prev[k]; !ok {
			delete(st.seen, k)
		}
	}
	r := Report{Lines: st.lines, Empty: st.empty, Malformed: st.malformed, Firsts: st.firsts, Final: final, Top: top,
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
	fmt.Fprintf(st.out, "%s after %s (%d empty, %d malformed, %s), %s of sketch\n", label, plural(r.Lines, "line"), r.Empty, r.Malformed, plural(r.Firsts, "first sighting"), formatBytes(r.MemBytes))
	w := tabwriter.NewWriter(st.out, 0, 0, 2, ' ', 0)
	if oneShot {
		fmt.Fprintln(w, "rank\tkey\testimate")
	} else {
		fmt.Fprintln(w, "rank\tkey\testimate\ttrend\tin top since")
	}
	for i, e := range top {
		if oneShot {
			fmt.Fprintf(w, "%d\t%s\t%d\n", i+1, displayKey(e.Key), e.Estimate)
			continue
		}
		seen := "-"
		if !e.InTopSince.IsZero() {
			seen = e.InTopSince.Format("2006-01-02 15:04:05")
		}
		fmt.Fprintf(w, "%d\t%s\t%d\t%s\t%s\n", i+1, displayKey(e.Key), e.Estimate, trend(*e.Previous, e.Estimate), seen)
	}
	w.Flush()
	fmt.Fprintln(st.out)
}

// readRecord is one line as read and the bytes it took, its end included.
type readRecord struct {
	line []byte
	n    int
}

// readLine returns the next line without its end (\n or \r\n), as a copy
// (an empty line is empty, not nil), and the bytes it took. A line longer
// than maxLine is read to its end and dropped: its line is nil. At the end
// of the input, or on a read error, n is 0 and err says which.
func readLine(br *bufio.Reader) (line []byte, n int, err error) {
	long := false
	for {
		chunk, err := br.ReadSlice('\n')
		n += len(chunk)
		if !long {
			if len(line)+len(chunk) > maxLine+2 {
				long, line = true, nil
			} else {
				line = append(line, chunk...)
			}
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil && n == 0 {
			return nil, 0, err
		}
		if long {
			return nil, n, nil
		}
		line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
		if line == nil {
			line = []byte{}
		}
		return line, n, nil
	}
}
