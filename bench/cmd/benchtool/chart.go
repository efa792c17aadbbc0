package main

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// chartSVG draws two bar panels from the throughput summaries: QPS (median bar,
// min–max whisker) and CPU µs per query, one bar per mode.
func chartSVG(ss []Summary, machine map[string]string) string {
	var rows []Summary
	for _, s := range ss {
		if s.Kind == "throughput" {
			rows = append(rows, s)
		}
	}
	const (
		width   = 1060
		panelW  = 500
		labelW  = 235
		barH    = 26
		gap     = 12
		top     = 92
		leftPad = 16
	)
	height := top + len(rows)*(barH+gap) + 60
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="13">`+"\n",
		width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="16" font-weight="bold">dotforward vs CoreDNS forward and Unbound (medians of one make bench run)</text>`+"\n", leftPad)
	fmt.Fprintf(&b, `<text x="%d" y="44" fill="#555">%s</text>`+"\n", leftPad, html.EscapeString(machineLine(machine)))

	panel := func(x0 int, title string, value func(Summary) (v, lo, hi float64), unit string, prec int) {
		maxV := 0.0
		for _, s := range rows {
			_, _, hi := value(s)
			maxV = math.Max(maxV, hi)
		}
		if maxV <= 0 || math.IsNaN(maxV) {
			maxV = 1
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-weight="bold">%s</text>`+"\n", x0, top-14, html.EscapeString(title))
		plotX := x0 + labelW
		plotW := panelW - labelW - 60
		for i, s := range rows {
			y := top + i*(barH+gap)
			v, lo, hi := value(s)
			fill := "#8da0cb"
			if s.Mode == "dotforward" {
				fill = "#e5793b"
			}
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", plotX-8, y+barH/2+5, html.EscapeString(label(s.Mode)))
			if math.IsNaN(v) {
				continue
			}
			w := v / maxV * float64(plotW)
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", plotX, y, w, barH, fill)
			if hi > lo {
				x1, x2 := float64(plotX)+lo/maxV*float64(plotW), float64(plotX)+hi/maxV*float64(plotW)
				ym := float64(y) + barH/2
				fmt.Fprintf(&b, `<path d="M%.1f %.1fH%.1fM%.1f %.1fV%.1fM%.1f %.1fV%.1f" stroke="#333" fill="none"/>`+"\n",
					x1, ym, x2, x1, ym-6, ym+6, x2, ym-6, ym+6)
			}
			fmt.Fprintf(&b, `<text x="%.1f" y="%d">%s%s</text>`+"\n", float64(plotX)+math.Max(w, hiX(hi, maxV, plotW))+6, y+barH/2+5, num(v, prec), unit)
		}
	}
	panel(leftPad, "Queries per second (bar: median, whisker: min–max)", func(s Summary) (float64, float64, float64) {
		return s.QPS, s.QPSMin, s.QPSMax
	}, "", 0)
	panel(leftPad+panelW+30, "CPU µs per query of the forwarding process", func(s Summary) (float64, float64, float64) {
		return s.CPUus, s.CPUus, s.CPUus
	}, " µs", 1)
	fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#555">Ratios within one run are the claim; absolute figures vary between runs and machines.</text>`+"\n",
		leftPad, height-20)
	b.WriteString("</svg>\n")
	return b.String()
}

func hiX(hi, maxV float64, plotW int) float64 { return hi / maxV * float64(plotW) }

func machineLine(m map[string]string) string {
	return fmt.Sprintf("%s CPUs, %s, kernel %s; dnsperf %s; %s rounds × %s s", m["nproc"], m["cpu"], m["kernel"],
		m["dnsperf_args"], m["rounds"], m["seconds"])
}
