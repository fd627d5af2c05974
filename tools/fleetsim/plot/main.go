// Command plot draws fleetsim's figures against the fleet size: it reads results files (JSON
// lines, one per run, as `fleetsim -results FILE` appends them) and writes one SVG with a
// panel per figure, each point a run, p50 and p99 as two series (the maximum where a run had
// fewer than 200 samples, drawn hollow, as fleetsim's table says "max of N").
//
//	go run ./tools/fleetsim/plot -o docs/scale.svg bin/scale-results.jsonl
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
)

// dist is fleetsim's Dist as read back.
type dist struct {
	N   int      `json:"n"`
	P50 float64  `json:"p50_ms"`
	P99 *float64 `json:"p99_ms"`
	Max float64  `json:"max_ms"`
}

// result holds the parts of fleetsim's Result the plot draws.
type result struct {
	Started  string `json:"started"`
	Clusters int    `json:"clusters"`
	Join     *struct {
		Register       dist    `json:"register"`
		Connected      dist    `json:"connected"`
		AllConnectedMS float64 `json:"all_connected_ms"`
	} `json:"join"`
	Grant *struct {
		Grant  dist `json:"grant"`
		Revoke dist `json:"revoke"`
	} `json:"grant"`
	Storm *struct {
		AllReconnectedMS float64 `json:"all_reconnected_ms"`
		GrantAfter       dist    `json:"grant_after"`
	} `json:"storm"`
	Placement *struct {
		Selected   dist `json:"selected"`
		Deselected dist `json:"deselected"`
	} `json:"placement"`
	Endpoints *struct {
		LoadAllServedMS float64 `json:"load_all_served_ms"`
		Served          dist    `json:"served"`
		XDS             dist    `json:"xds"`
	} `json:"endpoints"`
	Steady *struct {
		HubCPUPercent float64 `json:"hub_cpu_percent_of_a_core"`
		HubRSSMB      float64 `json:"hub_rss_mb"`
	} `json:"steady"`
}

// point is one run's value of one series; hollow marks a maximum standing in for a p99.
type point struct {
	x, y   float64
	hollow bool
}

type series struct {
	name   string
	points []point
}

type panel struct {
	title, unit string
	series      []series
}

// figure is one panel: how to read its series from a run.
type figure struct {
	title, unit string
	series      []string
	values      func(r *result) []*point // one per series, nil when the run lacks it
}

func distPoints(d *dist, scale float64) []*point {
	if d == nil || d.N == 0 {
		return []*point{nil, nil}
	}
	tail := &point{y: d.Max * scale, hollow: true}
	if d.P99 != nil {
		tail = &point{y: *d.P99 * scale}
	}
	return []*point{{y: d.P50 * scale}, tail}
}

func one(v float64, ok bool) []*point {
	if !ok || v <= 0 {
		return []*point{nil}
	}
	return []*point{{y: v}}
}

var pct = []string{"p50", "p99"}

var figures = []figure{
	{"registration call", "ms", pct, func(r *result) []*point {
		if r.Join == nil {
			return distPoints(nil, 1)
		}
		return distPoints(&r.Join.Register, 1)
	}},
	{"registered → Connected", "ms", pct, func(r *result) []*point {
		if r.Join == nil {
			return distPoints(nil, 1)
		}
		return distPoints(&r.Join.Connected, 1)
	}},
	{"all Connected (ramp 100/s included)", "s", []string{"all"}, func(r *result) []*point {
		if r.Join == nil {
			return []*point{nil}
		}
		return one(r.Join.AllConnectedMS/1000, true)
	}},
	{"grant → RoleBinding applied", "ms", pct, func(r *result) []*point {
		if r.Grant == nil {
			return distPoints(nil, 1)
		}
		return distPoints(&r.Grant.Grant, 1)
	}},
	{"revoke → RoleBinding removed", "ms", pct, func(r *result) []*point {
		if r.Grant == nil {
			return distPoints(nil, 1)
		}
		return distPoints(&r.Grant.Revoke, 1)
	}},
	{"placement: label change → namespace applied", "ms", pct, func(r *result) []*point {
		if r.Placement == nil {
			return distPoints(nil, 1)
		}
		return distPoints(&r.Placement.Selected, 1)
	}},
	{"placement: label change → namespace removed", "ms", pct, func(r *result) []*point {
		if r.Placement == nil {
			return distPoints(nil, 1)
		}
		return distPoints(&r.Placement.Deselected, 1)
	}},
	{"endpoints: slice update → GetServiceEndpoints", "ms", pct, func(r *result) []*point {
		if r.Endpoints == nil {
			return distPoints(nil, 1)
		}
		return distPoints(&r.Endpoints.Served, 1)
	}},
	{"endpoints: slice update → xDS client", "ms", pct, func(r *result) []*point {
		if r.Endpoints == nil {
			return distPoints(nil, 1)
		}
		return distPoints(&r.Endpoints.XDS, 1)
	}},
	{"endpoints: all slices reported → served", "s", []string{"all"}, func(r *result) []*point {
		if r.Endpoints == nil {
			return []*point{nil}
		}
		return one(r.Endpoints.LoadAllServedMS/1000, true)
	}},
	{"storm: hub restarted → all reconnected", "s", []string{"all"}, func(r *result) []*point {
		if r.Storm == nil {
			return []*point{nil}
		}
		return one(r.Storm.AllReconnectedMS/1000, true)
	}},
	{"idle hub CPU", "% of a core", []string{"hub"}, func(r *result) []*point {
		if r.Steady == nil {
			return []*point{nil}
		}
		return one(r.Steady.HubCPUPercent, true)
	}},
	{"hub RSS", "MB", []string{"hub"}, func(r *result) []*point {
		if r.Steady == nil {
			return []*point{nil}
		}
		return one(r.Steady.HubRSSMB, true)
	}},
}

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "plot:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("plot", flag.ContinueOnError)
	out := fs.String("o", "", "write the SVG here (default: stdout)")
	title := fs.String("title", "fleetsim: each figure against the number of clusters", "the image's title")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("usage: plot [-o FILE] RESULTS.jsonl [RESULTS.jsonl ...]")
	}
	var runs []*result
	for _, path := range fs.Args() {
		rs, err := readResults(path)
		if err != nil {
			return err
		}
		runs = append(runs, rs...)
	}
	if len(runs) == 0 {
		return errors.New("no runs in the results files")
	}
	panels := build(runs)
	w := stdout
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	return writeSVG(w, *title, panels)
}

func readResults(path string) ([]*result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []*result
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var r result
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		if r.Clusters > 0 {
			out = append(out, &r)
		}
	}
	return out, sc.Err()
}

// build turns runs into panels; a figure no run has is left out.
func build(runs []*result) []panel {
	sort.SliceStable(runs, func(i, j int) bool { return runs[i].Clusters < runs[j].Clusters })
	var panels []panel
	for _, f := range figures {
		p := panel{title: f.title, unit: f.unit}
		for i, name := range f.series {
			s := series{name: name}
			for _, r := range runs {
				if v := f.values(r)[i]; v != nil {
					v.x = float64(r.Clusters)
					s.points = append(s.points, *v)
				}
			}
			if len(s.points) > 0 {
				p.series = append(p.series, s)
			}
		}
		if len(p.series) > 0 {
			panels = append(panels, p)
		}
	}
	return panels
}

const (
	cols           = 3
	panelW, panelH = 330, 230
	padL, padR     = 58, 14
	padT, padB     = 34, 40
	headH          = 46
)

var colours = []string{"#1f77b4", "#d62728", "#2ca02c"}

func writeSVG(w io.Writer, title string, panels []panel) error {
	rows := (len(panels) + cols - 1) / cols
	width, height := cols*panelW, headH+rows*panelH
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="15" text-anchor="middle">%s</text>`+"\n", width/2, esc(title))
	fmt.Fprintf(&b, `<text x="%d" y="38" text-anchor="middle" fill="#555">filled: p50 / p99; hollow: the maximum, where a run had fewer than 200 samples</text>`+"\n", width/2)
	for i, p := range panels {
		drawPanel(&b, p, (i%cols)*panelW, headH+(i/cols)*panelH)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func drawPanel(b *strings.Builder, p panel, ox, oy int) {
	x0, x1 := float64(ox+padL), float64(ox+panelW-padR)
	y0, y1 := float64(oy+panelH-padB), float64(oy+padT)
	var xs []float64
	ymax := 0.0
	for _, s := range p.series {
		for _, pt := range s.points {
			xs = append(xs, pt.x)
			ymax = math.Max(ymax, pt.y)
		}
	}
	sort.Float64s(xs)
	xmin, xmax := xs[0], xs[len(xs)-1]
	logX := xmax/xmin >= 10
	xpos := func(x float64) float64 {
		if xmax == xmin {
			return (x0 + x1) / 2
		}
		if logX {
			return x0 + (math.Log10(x)-math.Log10(xmin))/(math.Log10(xmax)-math.Log10(xmin))*(x1-x0)
		}
		// A margin on each side so the extreme points are not on the axes.
		lo, hi := xmin-(xmax-xmin)*0.1, xmax+(xmax-xmin)*0.1
		return x0 + (x-lo)/(hi-lo)*(x1-x0)
	}
	top := niceCeil(ymax)
	ypos := func(y float64) float64 { return y0 - y/top*(y0-y1) }
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="12" font-weight="bold">%s</text>`+"\n", ox+10, oy+18, esc(p.title))
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", x0, y0, x1, y0)
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", x0, y0, x0, y1)
	for k := 0; k <= 4; k++ {
		v := top * float64(k) / 4
		y := ypos(v)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x0, y, x1, y)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", x0-4, y+4, num(v))
	}
	fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="middle" transform="rotate(-90 %d %.1f)">%s</text>`+"\n", ox+12, (y0+y1)/2, ox+12, (y0+y1)/2, esc(p.unit))
	seen := map[float64]bool{}
	for _, x := range xs {
		if seen[x] {
			continue
		}
		seen[x] = true
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", xpos(x), y0+14, num(x))
	}
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#555">clusters%s</text>`+"\n", (x0+x1)/2, y0+30, map[bool]string{true: " (log scale)"}[logX])
	for si, s := range p.series {
		c := colours[si%len(colours)]
		// The line through the runs' values in x order; the mean where a size ran more than once.
		byX := map[float64][]float64{}
		for _, pt := range s.points {
			byX[pt.x] = append(byX[pt.x], pt.y)
		}
		var path []string
		for _, x := range sortedKeys(byX) {
			path = append(path, fmt.Sprintf("%.1f,%.1f", xpos(x), ypos(mean(byX[x]))))
		}
		fmt.Fprintf(b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="1.5"/>`+"\n", strings.Join(path, " "), c)
		for _, pt := range s.points {
			fill := c
			if pt.hollow {
				fill = "white"
			}
			fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s" stroke="%s"/>`+"\n", xpos(pt.x), ypos(pt.y), fill, c)
		}
		if len(p.series) > 1 {
			lx := x0 + 8 + float64(si)*60
			fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"/><text x="%.1f" y="%.1f">%s</text>`+"\n", lx, y1+2, c, lx+7, y1+6, esc(s.name))
		}
	}
}

func sortedKeys(m map[float64][]float64) []float64 {
	out := make([]float64, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Float64s(out)
	return out
}

func mean(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (at least 1).
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func num(v float64) string {
	switch {
	case v == math.Trunc(v) && math.Abs(v) < 1e6:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.0f", v)
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
