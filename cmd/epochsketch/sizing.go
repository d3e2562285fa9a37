package main

import (
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/epochsketch/epochsketch"
)

// runSize applies the sizing rule (docs/DESIGN.md, Sizing).
func runSize(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("size", flag.ContinueOnError)
	heavy := fs.Int("heavy", 0, "expected concurrent heavy hitters (required)")
	factor := fs.Int("factor", epochsketch.SafetyFactor, "slots per heavy hitter (safety factor)")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if *heavy <= 0 {
		return usageErr("-heavy must be a positive number of keys, got %d", *heavy)
	}
	if *factor <= 0 {
		return usageErr("-factor must be positive, got %d", *factor)
	}
	// buckets >= heavy hitters × factor / 8 slots (epochsketch.BucketsFor
	// with the safety factor of 4).
	buckets := (*heavy**factor + 7) / 8
	bytes := buckets * 64
	fmt.Fprintf(stdout, "heavy hitters   %d\nsafety factor   %d slots each\nbuckets         %d (8 slots, 64 B each)\nmemory          %s\n",
		*heavy, *factor, buckets, formatBytes(bytes))
	fmt.Fprintf(stdout, "config          epochsketch.Config{NumBuckets: %d}\n", buckets)
	return nil
}

func formatBytes(n int) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// Tick Table rows (docs/DESIGN.md, The tick table), with their use cases.
var tickRows = []struct {
	tick time.Duration
	use  string
}{
	{100 * time.Millisecond, "DDoS packet filter"},
	{time.Second, "API rate limiting"},
	{time.Minute, "Telemetry sampling"},
	{time.Hour, "Fraud/abuse velocity"},
	{24 * time.Hour, "Long-term trending"},
}

// runTicks prints the Tick Table: under per-tick halving a sustained rate R
// per tick converges to 2R, so the 24-bit count's ceiling allows
// R_max = (2^24-1)/2 per tick for one key; every count evaporates after 24
// silent ticks.
func runTicks(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ticks", flag.ContinueOnError)
	tick := fs.Duration("tick", 0, "print the row for this tick only (e.g. 250ms, 5m)")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	rows := tickRows
	if *tick != 0 {
		if err := (epochsketch.Config{TickDuration: *tick}).Validate(); err != nil {
			return usageErr("-tick: %v", err)
		}
		rows = []struct {
			tick time.Duration
			use  string
		}{{*tick, useFor(*tick)}}
	}
	w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "tick (half-life)\tmax sustained rate, 1 key\tcomplete evaporation\tuse case\t")
	for _, r := range rows {
		perTick := float64(epochsketch.MaxCount) / 2
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t\n", formatDuration(r.tick), formatRate(perTick/r.tick.Seconds()),
			formatSeconds(24*r.tick.Seconds()), r.use) // 24 ticks can pass a time.Duration's 292 years
	}
	return w.Flush()
}

func useFor(d time.Duration) string {
	switch {
	case d < time.Second:
		return "DDoS packet filter"
	case d < time.Minute:
		return "API rate limiting"
	case d < time.Hour:
		return "Telemetry sampling"
	case d < 24*time.Hour:
		return "Fraud/abuse velocity"
	}
	return "Long-term trending"
}
