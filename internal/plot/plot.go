// Package plot writes small self-contained SVG charts (stdlib only) for
// THEORY.md and BENCHMARKS.md, committed as they are (one image format).
package plot

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// Series is one line of a plot.
type Series struct {
	Name   string
	Points [][2]float64
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#000000", "#aec7e8", "#98df8a", "#ff9896"}

// LinePlot renders series as a self-contained SVG line chart with axes,
// ticks and a legend.
func LinePlot(title, xlabel, ylabel string, series []Series) string {
	const W, H, L, R, T, B = 780.0, 440.0, 70.0, 230.0, 40.0, 55.0
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range series {
		for _, p := range s.Points {
			xmin, xmax = min(xmin, p[0]), max(xmax, p[0])
			ymin, ymax = min(ymin, p[1]), max(ymax, p[1])
		}
	}
	if ymin == ymax {
		ymin, ymax = ymin-1, ymax+1
	}
	if xmin == xmax {
		xmin, xmax = xmin-1, xmax+1
	}
	px := func(x float64) float64 { return L + (x-xmin)/(xmax-xmin)*(W-L-R) }
	py := func(y float64) float64 { return H - B - (y-ymin)/(ymax-ymin)*(H-T-B) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" font-family="sans-serif" font-size="12">`, W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`)
	fmt.Fprintf(&b, `<text x="%g" y="22" font-size="15" text-anchor="middle">%s</text>`, (W-R+L)/2, html.EscapeString(title))
	for i := 0; i <= 5; i++ {
		x := xmin + float64(i)/5*(xmax-xmin)
		y := ymin + float64(i)/5*(ymax-ymin)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="#ddd"/>`, px(x), T, px(x), H-B)
		fmt.Fprintf(&b, `<text x="%.1f" y="%g" text-anchor="middle">%s</text>`, px(x), H-B+16, tick(x))
		fmt.Fprintf(&b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#ddd"/>`, L, py(y), W-R, py(y))
		fmt.Fprintf(&b, `<text x="%g" y="%.1f" text-anchor="end">%s</text>`, L-6, py(y)+4, tick(y))
	}
	fmt.Fprintf(&b, `<rect x="%g" y="%g" width="%g" height="%g" fill="none" stroke="black"/>`, L, T, W-L-R, H-T-B)
	fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="middle">%s</text>`, (W-R+L)/2, H-12, html.EscapeString(xlabel))
	fmt.Fprintf(&b, `<text x="16" y="%g" text-anchor="middle" transform="rotate(-90 16 %g)">%s</text>`, (H-B+T)/2, (H-B+T)/2, html.EscapeString(ylabel))
	// Draw the first series last, so it stays on top where lines overlap.
	for i := len(series) - 1; i >= 0; i-- {
		s := series[i]
		c := palette[i%len(palette)]
		var pts []string
		for _, p := range s.Points {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(p[0]), py(p[1])))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, c, strings.Join(pts, " "))
		ly := T + 10 + float64(i)*18
		fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="%s" stroke-width="3"/>`, W-R+12, ly, W-R+32, ly, c)
		fmt.Fprintf(&b, `<text x="%g" y="%g">%s</text>`, W-R+38, ly+4, html.EscapeString(s.Name))
	}
	b.WriteString(`</svg>`)
	return b.String()
}

func tick(v float64) string {
	if math.Abs(v) >= 1e4 || (v != 0 && math.Abs(v) < 1e-2) {
		return fmt.Sprintf("%.1e", v)
	}
	return fmt.Sprintf("%.3g", v)
}

// Bar is one labelled value.
type Bar struct {
	Label string
	Value float64
}

// BarsLog renders horizontal bars on a log10 axis, in the given order, with
// each value printed at the bar's end.
func BarsLog(title, xlabel string, bars []Bar) string {
	const W, L, R, T, rowH = 760.0, 190.0, 70.0, 40.0, 22.0
	H := T + 45 + rowH*float64(len(bars))
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, b := range bars {
		if b.Value > 0 {
			lo, hi = min(lo, b.Value), max(hi, b.Value)
		}
	}
	lmin, lmax := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if lmin == lmax {
		lmax++
	}
	px := func(v float64) float64 { return L + (math.Log10(v)-lmin)/(lmax-lmin)*(W-L-R) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" font-family="sans-serif" font-size="12">`, W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`)
	fmt.Fprintf(&b, `<text x="%g" y="22" font-size="15" text-anchor="middle">%s</text>`, W/2, html.EscapeString(title))
	for e := lmin; e <= lmax; e++ {
		x := L + (e-lmin)/(lmax-lmin)*(W-L-R)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="#ddd"/>`, x, T, x, H-40)
		fmt.Fprintf(&b, `<text x="%.1f" y="%g" text-anchor="middle">%s</text>`, x, H-26, tick(math.Pow(10, e)))
	}
	for i, br := range bars {
		y := T + float64(i)*rowH
		fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="end">%s</text>`, L-6, y+rowH/2+4, html.EscapeString(br.Label))
		if br.Value > 0 {
			c := palette[0]
			if strings.HasPrefix(br.Label, "floor") {
				c = "#999"
			} else if strings.HasPrefix(br.Label, "epochsketch") {
				c = palette[1]
			}
			fmt.Fprintf(&b, `<rect x="%g" y="%g" width="%.1f" height="%g" fill="%s"/>`, L, y+3, max(px(br.Value)-L, 1), rowH-6, c)
			fmt.Fprintf(&b, `<text x="%.1f" y="%g">%s</text>`, px(br.Value)+4, y+rowH/2+4, tick(br.Value))
		}
	}
	fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="middle">%s</text>`, (W-R+L)/2, H-8, html.EscapeString(xlabel))
	b.WriteString(`</svg>`)
	return b.String()
}
