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
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"
)

const usage = `usage:
  epochsketch                   run the built-in demo stream
  epochsketch demo [-seed N]    the same, with a seed
  epochsketch size -heavy N [-factor F]
                                buckets and bytes for N concurrent heavy hitters
  epochsketch ticks [-tick D]   the Tick Table (spec 3.4), or one row for tick D
  epochsketch top [-k N] [-lines-per-tick N] [-every N] [-json] [-state FILE] [FILE...]
                                the heaviest recent keys of a stream, one key per line
                                (files, gzip or standard input)
  epochsketch sim [-quick] [-out DIR] [-section N,M]
                                run THEORY.md's experiments; prints markdown tables
  epochsketch simulator [-addr HOST:PORT] [-dir DIR] [-export DIR]
                                serve the browser simulator on localhost, offline
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// usageError is a bad command line: it exits with status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cmd := "demo"
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
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
			fs.SetOutput(stderr)
			fs.PrintDefaults()
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
	switch {
	case d >= 48*time.Hour:
		return fmt.Sprintf("%gd", d.Hours()/24)
	case d >= time.Hour:
		return fmt.Sprintf("%gh", d.Hours())
	case d >= time.Minute:
		return fmt.Sprintf("%gmin", d.Minutes())
	default:
		return d.String()
	}
}
