package main

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// Chart geometry shared by the charts of make bench and of the regimes phase.
const (
	chartWidth   = 1060
	chartPanelW  = 500
	chartLabelW  = 235
	chartBarH    = 26
	chartGap     = 12
	chartTop     = 92
	chartLeftPad = 16
)

// bar is one bar of a panel: value v with an optional lo–hi whisker.
type bar struct {
	label     string
	v, lo, hi float64
	highlight bool // dotforward's bars are orange, the others blue
}

// barPanel draws a panel of horizontal bars at x0 below chartTop. With logScale
// the axis is logarithmic from the largest power of ten at or below the smallest
// value, with a tick per decade.
func barPanel(b *strings.Builder, x0 int, title string, bars []bar, unit string, prec int, logScale bool) {
	maxV, minV := 0.0, math.Inf(1)
	for _, r := range bars {
		for _, v := range []float64{r.v, r.hi} {
			if !math.IsNaN(v) {
				maxV = math.Max(maxV, v)
			}
		}
		if r.v > 0 {
			minV = math.Min(minV, r.v)
		}
	}
	if maxV <= 0 || math.IsNaN(maxV) {
		maxV = 1
	}
	plotX := x0 + chartLabelW
	plotW := chartPanelW - chartLabelW - 60
	pos := func(v float64) float64 { return v / maxV * float64(plotW) }
	if logScale {
		if math.IsInf(minV, 1) {
			minV = maxV / 10
		}
		floor := math.Pow(10, math.Floor(math.Log10(minV)))
		top := math.Pow(10, math.Ceil(math.Log10(maxV)))
		if top <= floor {
			top = floor * 10
		}
		pos = func(v float64) float64 {
			if v <= floor {
				return 0
			}
			return math.Log10(v/floor) / math.Log10(top/floor) * float64(plotW)
		}
		bottom := chartTop + len(bars)*(chartBarH+chartGap)
		for t := floor; t <= top*1.0001; t *= 10 {
			x := float64(plotX) + pos(t)
			fmt.Fprintf(b, `<path d="M%.1f %dV%d" stroke="#ddd"/>`+"\n", x, chartTop-4, bottom-chartGap+4)
			fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle" fill="#555" font-size="11">%s</text>`+"\n", x, bottom+8, num(t, max(0, -int(math.Floor(math.Log10(t))))))
		}
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" font-weight="bold">%s</text>`+"\n", x0, chartTop-14, html.EscapeString(title))
	for i, r := range bars {
		y := chartTop + i*(chartBarH+chartGap)
		fill := "#8da0cb"
		if r.highlight {
			fill = "#e5793b"
		}
		fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", plotX-8, y+chartBarH/2+5, html.EscapeString(r.label))
		if math.IsNaN(r.v) {
			continue
		}
		w := pos(r.v)
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", plotX, y, w, chartBarH, fill)
		if r.hi > r.lo {
			x1, x2 := float64(plotX)+pos(r.lo), float64(plotX)+pos(r.hi)
			ym := float64(y) + chartBarH/2
			fmt.Fprintf(b, `<path d="M%.1f %.1fH%.1fM%.1f %.1fV%.1fM%.1f %.1fV%.1f" stroke="#333" fill="none"/>`+"\n",
				x1, ym, x2, x1, ym-6, ym+6, x2, ym-6, ym+6)
		}
		end := w
		if !math.IsNaN(r.hi) {
			end = math.Max(w, pos(r.hi))
		}
		fmt.Fprintf(b, `<text x="%.1f" y="%d">%s%s</text>`+"\n", float64(plotX)+end+6, y+chartBarH/2+5, num(r.v, prec), unit)
	}
}

// svgOpen starts a chart of rows bars per panel (extra: more height below them),
// with a title and up to two lines below it.
func svgOpen(b *strings.Builder, rows, extra int, title string, subtitles ...string) int {
	height := chartTop + rows*(chartBarH+chartGap) + 60 + extra
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="13">`+"\n",
		chartWidth, height, chartWidth, height)
	fmt.Fprintf(b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", chartWidth, height)
	fmt.Fprintf(b, `<text x="%d" y="24" font-size="16" font-weight="bold">%s</text>`+"\n", chartLeftPad, html.EscapeString(title))
	if len(subtitles) > 0 {
		fmt.Fprintf(b, `<text x="%d" y="44" fill="#555">%s</text>`+"\n", chartLeftPad, html.EscapeString(subtitles[0]))
	}
	if len(subtitles) > 1 {
		fmt.Fprintf(b, `<text x="%d" y="60" fill="#555" font-size="12">%s</text>`+"\n", chartLeftPad, html.EscapeString(subtitles[1]))
	}
	return height
}

func svgClose(b *strings.Builder, height int, note string) {
	fmt.Fprintf(b, `<text x="%d" y="%d" fill="#555">%s</text>`+"\n", chartLeftPad, height-20, html.EscapeString(note))
	b.WriteString("</svg>\n")
}

// chartSVG draws two bar panels from the throughput summaries: QPS (median bar,
// min–max whisker) and CPU µs per query, one bar per mode.
func chartSVG(ss []Summary, machine map[string]string) string {
	var qps, cpu []bar
	for _, s := range ss {
		if s.Kind != "throughput" {
			continue
		}
		qps = append(qps, bar{label: label(s.Mode), v: s.QPS, lo: s.QPSMin, hi: s.QPSMax, highlight: s.Mode == "dotforward"})
		cpu = append(cpu, bar{label: label(s.Mode), v: s.CPUus, lo: s.CPUus, hi: s.CPUus, highlight: s.Mode == "dotforward"})
	}
	var b strings.Builder
	height := svgOpen(&b, len(qps), 0, "dotforward vs CoreDNS forward and Unbound (medians of one make bench run)", machineLine(machine))
	barPanel(&b, chartLeftPad, "Queries per second (bar: median, whisker: min–max)", qps, "", 0, false)
	barPanel(&b, chartLeftPad+chartPanelW+30, "CPU µs per query of the forwarding process", cpu, " µs", 1, false)
	svgClose(&b, height, "Ratios within one run are the claim; absolute figures vary between runs and machines.")
	return b.String()
}

func machineLine(m map[string]string) string {
	return fmt.Sprintf("%s CPUs, %s, kernel %s; dnsperf %s; %s rounds × %s s", m["nproc"], m["cpu"], m["kernel"],
		m["dnsperf_args"], m["rounds"], m["seconds"])
}
