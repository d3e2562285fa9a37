package sim

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

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"}

// LinePlot renders series as a self-contained SVG line chart with axes,
// ticks and a legend. scripts/theory.sh converts it to PNG for docs/.
func LinePlot(title, xlabel, ylabel string, series []Series) string {
	const W, H, L, R, T, B = 720.0, 440.0, 70.0, 170.0, 40.0, 55.0
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
