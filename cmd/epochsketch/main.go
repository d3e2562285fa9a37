// Command epochsketch shows what an EpochSketch sees.
//
// Usage:
//
//	epochsketch                     run the built-in demo stream
//	epochsketch demo [-seed N]      the same, with a seed
//	epochsketch size -heavy N       buckets and bytes for N concurrent heavy hitters
//	epochsketch ticks [-tick D]     the Tick Table: velocity ceiling and evaporation per tick
//	epochsketch top [FILE...]       the heaviest recent keys of a stream, one key per line
//	epochsketch sim [-quick]        THEORY.md's experiments, as markdown tables
//	epochsketch simulator           the browser simulator on localhost (the real package as WebAssembly)
//	epochsketch help [COMMAND]      the commands and their flags (also -h, --help)
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"time"
)

const usage = `usage: epochsketch [COMMAND] [FLAGS]

commands:
  epochsketch                   run the built-in demo stream
  epochsketch demo [-seed N] [-buckets N]
                                the same, with a seed
  epochsketch size -heavy N [-factor F]
                                buckets and bytes for N concurrent heavy hitters
  epochsketch ticks [-tick D]   the Tick Table (docs/DESIGN.md), or one row for tick D
  epochsketch top [-k N] [-format lines|clf|combined|json] [-key K] [-field F]
                  [-time-field F] [-time-format LAYOUT] [-tick D] [-lines-per-tick N]
                  [-live] [-refresh D] [-every N] [-json] [-state FILE] [-firsts]
                  [-show-malformed] [-progress auto|on|off] [-buckets N] [-seed N]
                  [FILE...]
                                the heaviest recent keys of a stream (files, gzip or
                                standard input): one key per line, access logs or JSON lines
  epochsketch sim [-quick] [-out DIR] [-section N,M] [-subtlex FILE]
                                run THEORY.md's experiments; prints markdown tables
  epochsketch simulator [-addr HOST:PORT] [-dir DIR] [-export DIR]
                                serve the browser simulator on localhost, offline
  epochsketch help [COMMAND]    this list, or a command's flags

'epochsketch COMMAND -h' describes a command's flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// usageError is a bad command line: it exits with status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cmd := "demo"
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		cmd = "help" // the tool's help lists its commands, not the demo's flags
	} else if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "demo":
		err = runDemo(args, stdout, stderr)
	case "size":
		err = runSize(args, stdout, stderr)
	case "ticks":
		err = runTicks(args, stdout, stderr)
	case "sim":
		err = runSim(args, stdout, stderr)
	case "top":
		err = runTop(args, stdin, stdout, stderr)
	case "simulator":
		err = runSimulator(args, stdout, stderr)
	case "help":
		if len(args) > 0 && args[0] != "help" && args[0] != "" && args[0][0] != '-' {
			return run([]string{args[0], "-h"}, stdin, stdout, stdout) // epochsketch help top
		}
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "epochsketch: unknown command %q\n%s", cmd, usage)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, new(*usageError)):
		fmt.Fprintf(stderr, "epochsketch %s: %v\nrun 'epochsketch help' for usage\n", cmd, err)
		return 2
	default:
		fmt.Fprintf(stderr, "epochsketch %s: %v\n", cmd, err)
		return 1
	}
}

// usageErr wraps a message as a usage error (exit status 2).
func usageErr(format string, a ...any) error {
	return &usageError{fmt.Sprintf(format, a...)}
}

// parse parses flags; a bad flag is a usage error, and extra arguments are
// refused. The flag package's own message is replaced by ours.
func parse(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp(fs, stderr)
			return err
		}
		return usageErr("%v", err)
	}
	if fs.NArg() > 0 {
		return usageErr("unexpected argument %q", fs.Arg(0))
	}
	return nil
}

func formatRate(perSecond float64) string {
	switch {
	case perSecond >= 1e6:
		return fmt.Sprintf("%.2f M/s", perSecond/1e6)
	case perSecond >= 1e3:
		return fmt.Sprintf("%.1f k/s", perSecond/1e3)
	case perSecond >= 1:
		return fmt.Sprintf("%.1f /s", perSecond)
	default:
		return fmt.Sprintf("%.2f /min", perSecond*60)
	}
}

func formatDuration(d time.Duration) string {
	return formatSeconds(d.Seconds())
}

// formatSeconds writes a span in the largest fitting unit, rounded: 41d16h,
// not 41.666666666666664d; a span too long for a time.Duration is given in
// years rather than overflowing.
func formatSeconds(s float64) string {
	const day, year = 86400.0, 365.25 * 86400
	switch {
	case s >= 100*year:
		return fmt.Sprintf("%.0f years", s/year)
	case s >= 2*year:
		return fmt.Sprintf("%.1f years", s/year)
	case s >= 2*day:
		d, h := int64(s/day), int64(math.Round(math.Mod(s, day)/3600))
		if h == 24 {
			d, h = d+1, 0
		}
		if h == 0 {
			return fmt.Sprintf("%dd", d)
		}
		return fmt.Sprintf("%dd%dh", d, h)
	case s >= 3600:
		return strconv.FormatFloat(math.Round(s/360)/10, 'f', -1, 64) + "h"
	case s >= 60:
		return strconv.FormatFloat(math.Round(s/6)/10, 'f', -1, 64) + "min"
	default:
		return time.Duration(s * 1e9).String()
	}
}

// descriptions say in one line what each command does (its -h).
var descriptions = map[string]string{
	"demo":      "replay a built-in stream (a crowd, an attacker, a key-rotation flood) and show the sketch's estimates beside the exact decayed counts",
	"size":      "how many buckets and bytes a sketch needs for N concurrent heavy hitters",
	"ticks":     "the Tick Table: for each tick, the fastest sustained rate one key can have and how long a count takes to evaporate",
	"top":       "the heaviest recent keys of a stream (files, gzip or standard input): one key per line, access logs or JSON lines",
	"sim":       "run THEORY.md's experiments and print them as markdown tables",
	"simulator": "serve the browser simulator (the real package as WebAssembly) on localhost, offline",
}

// printHelp writes a command's one-line description and its flags.
func printHelp(fs *flag.FlagSet, w io.Writer) {
	fmt.Fprintf(w, "epochsketch %s: %s\n\nflags:\n", fs.Name(), descriptions[fs.Name()])
	fs.SetOutput(w)
	fs.PrintDefaults()
}
