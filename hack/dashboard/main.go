// Command dashboard draws the chart's Grafana dashboard (charts/istio-cni/dashboards/
// istio-cni.json) into a PNG from a real run, for the README: Grafana itself cannot
// be built offline here.
//
// It builds and starts a real install-cni (standalone mode, in temporary node
// directories), runs the real istio-cni plugin's ADD in fresh network namespaces
// (pods of an excluded namespace, passed through, and ADDs with a malformed
// CNI_ARGS, which fail) at a varying rate, and scrapes the agent's /metrics every
// -interval for -duration. The scrapes go into a Prometheus TSDB, and each panel's
// own PromQL queries are evaluated by Prometheus' PromQL engine over the run
// ($job and $instance match everything); the figures are drawn as lines (time
// series panels) or the last value (stat panels). Needs root (network namespaces).
//
//	sudo go run . -out ../../docs/dashboard.png   (from hack/dashboard)
package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"log"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/tsdb"
	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

func main() {
	out := flag.String("out", "dashboard.png", "the PNG to write")
	duration := flag.Duration("duration", 3*time.Minute, "how long the run lasts")
	interval := flag.Duration("interval", 5*time.Second, "scrape interval")
	flag.Parse()
	if err := run(*out, *duration, *interval); err != nil {
		log.Fatal(err)
	}
}

type panel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	GridPos struct{ X, Y, W, H int }
	Targets []struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
}

func run(out string, duration, interval time.Duration) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	var dash struct {
		Title  string  `json:"title"`
		Panels []panel `json:"panels"`
	}
	data, err := os.ReadFile(filepath.Join(root, "charts/istio-cni/dashboards/istio-cni.json"))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		return err
	}

	work, err := os.MkdirTemp("", "dashboard")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	metricsURL, stop, err := startAgent(root, work)
	if err != nil {
		return err
	}
	defer stop()

	db, err := tsdb.Open(filepath.Join(work, "tsdb"), nil, nil, tsdb.DefaultOptions(), nil)
	if err != nil {
		return err
	}
	defer db.Close()
	p := parser.NewParser(parser.Options{})

	start := time.Now()
	nextScrape := start
	adds, failed := 0, 0
	for time.Since(start) < duration {
		if time.Now().After(nextScrape) {
			if err := scrape(db, p, metricsURL, time.Now()); err != nil {
				return err
			}
			nextScrape = nextScrape.Add(interval)
		}
		// A rate that rises and falls over the run; one ADD in ten fails.
		phase := time.Since(start).Seconds() / duration.Seconds()
		pause := time.Duration(float64(400*time.Millisecond) * (1.2 - math.Sin(phase*math.Pi)))
		bad := adds%10 == 9
		if err := pluginAdd(work, adds, bad); err != nil && !bad {
			return fmt.Errorf("ADD %d: %w", adds, err)
		}
		if bad {
			failed++
		}
		adds++
		time.Sleep(pause)
	}
	if err := scrape(db, p, metricsURL, time.Now()); err != nil {
		return err
	}
	end := time.Now()
	log.Printf("%d ADDs (%d failing on purpose) in %s, scraped every %s", adds, failed, end.Sub(start).Round(time.Second), interval)

	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1e7, Timeout: time.Minute, LookbackDelta: 5 * time.Minute, Parser: p})
	img := newCanvas(dash.Title, start, end)
	for _, pn := range dash.Panels {
		var series []line
		for _, t := range pn.Targets {
			expr := strings.NewReplacer(`$job`, `.+`, `$instance`, `.+`).Replace(t.Expr)
			step := interval
			q, err := engine.NewRangeQuery(context.Background(), db, nil, expr, start.Add(interval), end, step)
			if err != nil {
				return fmt.Errorf("panel %q: %s: %w", pn.Title, expr, err)
			}
			res := q.Exec(context.Background())
			if res.Err != nil {
				return fmt.Errorf("panel %q: %s: %w", pn.Title, expr, res.Err)
			}
			m, err := res.Matrix()
			if err != nil {
				return err
			}
			for _, s := range m {
				l := line{name: legend(t.LegendFormat, s.Metric)}
				for _, f := range s.Floats {
					l.points = append(l.points, point{time.UnixMilli(f.T), f.F})
				}
				series = append(series, l)
			}
			q.Close()
		}
		img.panel(pn, series)
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	return png.Encode(f, img.rgba)
}

func repoRoot() (string, error) {
	b, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("find the repository: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// startAgent builds the binaries and runs install-cni in standalone mode on
// temporary node directories, returning its /metrics URL.
func startAgent(root, work string) (string, func(), error) {
	bin := filepath.Join(work, "bin")
	for _, c := range []string{"install-cni", "istio-cni", "istio-iptables"} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(bin, c), "./cmd/"+c)
		cmd.Dir, cmd.Stderr = root, os.Stderr
		if err := cmd.Run(); err != nil {
			return "", nil, fmt.Errorf("build %s: %w", c, err)
		}
	}
	for _, d := range []string{"net.d", "cnibin", "run", "sa"} {
		if err := os.MkdirAll(filepath.Join(work, d), 0o755); err != nil {
			return "", nil, err
		}
	}
	for name, v := range map[string]string{"token": "t", "ca.crt": ""} {
		if err := os.WriteFile(filepath.Join(work, "sa", name), []byte(v), 0o600); err != nil {
			return "", nil, err
		}
	}
	agent := exec.Command(filepath.Join(bin, "install-cni"))
	agent.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"MOUNTED_CNI_NET_DIR=" + filepath.Join(work, "net.d"), "MOUNTED_CNI_BIN_DIR=" + filepath.Join(work, "cnibin"),
		"CNI_BIN_SOURCE_DIR=" + bin, "CNI_AGENT_RUN_DIR=" + filepath.Join(work, "run"),
		"SERVICE_ACCOUNT_DIR=" + filepath.Join(work, "sa"), "SKIP_TLS_VERIFY=true",
		"KUBERNETES_SERVICE_HOST=127.0.0.1", "KUBERNETES_SERVICE_PORT=6443",
		"MONITORING_PORT=0", "READINESS_PORT=0", "POD_CACHE_ENABLED=false", "REPAIR_ENABLED=false",
		"UNINSTALL_ON_EXIT=always", "CHAINED_CNI_PLUGIN=false", "EXCLUDE_NAMESPACES=kube-system",
	}
	stderr, err := agent.StderrPipe()
	if err != nil {
		return "", nil, err
	}
	agent.Stdout = io.Discard
	if err := agent.Start(); err != nil {
		return "", nil, err
	}
	stop := func() { agent.Process.Signal(syscall.SIGTERM); agent.Wait() }
	addr := regexp.MustCompile(`serves=metrics addr=\S*:(\d+)`)
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if m := addr.FindStringSubmatch(sc.Text()); m != nil {
			go io.Copy(io.Discard, stderr)
			url := "http://127.0.0.1:" + m[1] + "/metrics"
			// Wait for the standalone config: the plugin's ADDs need it.
			conf := filepath.Join(work, "net.d", "zz-istio-cni.conf")
			for i := 0; i < 200; i++ {
				if _, err := os.Stat(conf); err == nil {
					return url, stop, nil
				}
				time.Sleep(50 * time.Millisecond)
			}
			stop()
			return "", nil, fmt.Errorf("install-cni wrote no %s", conf)
		}
	}
	stop()
	return "", nil, fmt.Errorf("install-cni did not start its metrics server")
}

// pluginAdd runs the installed plugin's ADD as a runtime does, with the installed
// config, in a fresh network namespace.
func pluginAdd(work string, n int, bad bool) error {
	ns := exec.Command("sleep", "60")
	ns.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	if err := ns.Start(); err != nil {
		return err
	}
	defer func() { ns.Process.Kill(); ns.Wait() }()
	conf, err := os.ReadFile(filepath.Join(work, "net.d", "zz-istio-cni.conf"))
	if err != nil {
		return err
	}
	args := fmt.Sprintf("K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-%d", n)
	if bad {
		args += ";junk"
	}
	cmd := exec.Command(filepath.Join(work, "cnibin", "istio-cni"))
	cmd.Env = []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=" + fmt.Sprintf("%016x", n), "CNI_IFNAME=eth0",
		"CNI_NETNS=" + fmt.Sprintf("/proc/%d/ns/net", ns.Process.Pid), "CNI_ARGS=" + args, "CNI_PATH=" + filepath.Join(work, "cnibin")}
	cmd.Stdin = bytes.NewReader(conf)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: %s", err, out)
	}
	return nil
}

// scrape reads /metrics once and appends every sample at t, with the labels a
// Prometheus scrape adds.
func scrape(db *tsdb.DB, p parser.Parser, url string, t time.Time) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	app := db.Appender(context.Background())
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		text := sc.Text()
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		i := strings.LastIndexByte(text, ' ')
		v, err := strconv.ParseFloat(text[i+1:], 64)
		if err != nil {
			return fmt.Errorf("sample %q: %w", text, err)
		}
		ls, err := p.ParseMetric(text[:i])
		if err != nil {
			return fmt.Errorf("sample %q: %w", text, err)
		}
		b := labels.NewBuilder(ls)
		b.Set("job", "istio-cni")
		b.Set("instance", "node-a")
		if _, err := app.Append(0, b.Labels(), t.UnixMilli(), v); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return app.Commit()
}

func legend(format string, m labels.Labels) string {
	if format == "" {
		return m.String()
	}
	return regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`).ReplaceAllStringFunc(format, func(s string) string {
		return m.Get(strings.Trim(s, "{} "))
	})
}

type point struct {
	t time.Time
	v float64
}

type line struct {
	name   string
	points []point
}

// canvas lays the panels out on Grafana's 24-column grid.
type canvas struct {
	rgba       *image.RGBA
	start, end time.Time
}

const (
	colW, rowH = 56, 30 // pixels per grid column and row
	margin     = 6
	header     = 34
)

var (
	bg      = color.RGBA{0x11, 0x12, 0x17, 0xff}
	panelBg = color.RGBA{0x18, 0x1b, 0x1f, 0xff}
	border  = color.RGBA{0x2c, 0x30, 0x35, 0xff}
	text    = color.RGBA{0xcc, 0xcc, 0xdc, 0xff}
	dim     = color.RGBA{0x8e, 0x8e, 0x8e, 0xff}
	palette = []color.RGBA{{0x73, 0xbf, 0x69, 0xff}, {0xf2, 0xcc, 0x0c, 0xff}, {0x57, 0x94, 0xf2, 0xff},
		{0xff, 0x78, 0x0a, 0xff}, {0xf2, 0x49, 0x5c, 0xff}, {0xb8, 0x77, 0xd9, 0xff}}
)

func newCanvas(title string, start, end time.Time) *canvas {
	img := image.NewRGBA(image.Rect(0, 0, 24*colW, header+36*rowH+margin))
	draw.Draw(img, img.Bounds(), &image.Uniform{bg}, image.Point{}, draw.Src)
	c := &canvas{rgba: img, start: start, end: end}
	c.text(margin, 22, title+fmt.Sprintf("   (a real agent and plugin, %s run, drawn from its scrapes by hack/dashboard)",
		end.Sub(start).Round(time.Second)), text, 1)
	return c
}

func (c *canvas) text(x, y int, s string, col color.Color, scale int) {
	if scale == 1 {
		d := font.Drawer{Dst: c.rgba, Src: &image.Uniform{col}, Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
		d.DrawString(s)
		return
	}
	small := image.NewRGBA(image.Rect(0, 0, 7*len(s), 13))
	d := font.Drawer{Dst: small, Src: &image.Uniform{col}, Face: basicfont.Face7x13, Dot: fixed.P(0, 10)}
	d.DrawString(s)
	for sy := 0; sy < 13; sy++ {
		for sx := 0; sx < small.Bounds().Dx(); sx++ {
			if _, _, _, a := small.At(sx, sy).RGBA(); a > 0 {
				draw.Draw(c.rgba, image.Rect(x+sx*scale, y-10*scale+sy*scale, x+(sx+1)*scale, y-10*scale+(sy+1)*scale),
					&image.Uniform{col}, image.Point{}, draw.Src)
			}
		}
	}
}

func (c *canvas) rect(r image.Rectangle, col color.Color) {
	draw.Draw(c.rgba, r, &image.Uniform{col}, image.Point{}, draw.Src)
}

func (c *canvas) panel(p panel, series []line) {
	r := image.Rect(p.GridPos.X*colW+margin, header+p.GridPos.Y*rowH+margin,
		(p.GridPos.X+p.GridPos.W)*colW, header+(p.GridPos.Y+p.GridPos.H)*rowH)
	c.rect(r, border)
	c.rect(r.Inset(1), panelBg)
	c.text(r.Min.X+8, r.Min.Y+16, p.Title, text, 1)
	unit := p.FieldConfig.Defaults.Unit
	if p.Type == "stat" {
		v := "No data"
		if len(series) > 0 && len(series[0].points) > 0 {
			v = format(series[0].points[len(series[0].points)-1].v, unit)
		}
		c.text(r.Min.X+16, r.Max.Y-22, v, palette[0], 4)
		return
	}
	plot := image.Rect(r.Min.X+64, r.Min.Y+28, r.Max.X-12, r.Max.Y-40)
	sort.Slice(series, func(i, j int) bool { return series[i].name < series[j].name })
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range series {
		for _, pt := range s.points {
			if !math.IsNaN(pt.v) && !math.IsInf(pt.v, 0) {
				lo, hi = math.Min(lo, pt.v), math.Max(hi, pt.v)
			}
		}
	}
	if math.IsInf(lo, 1) {
		c.text(plot.Min.X+plot.Dx()/2-28, plot.Min.Y+plot.Dy()/2, "No data", dim, 1)
		return
	}
	lo = math.Min(lo, 0)
	if hi <= lo {
		hi = lo + 1
	}
	for i := 0; i <= 4; i++ {
		y := plot.Max.Y - i*plot.Dy()/4
		c.rect(image.Rect(plot.Min.X, y, plot.Max.X, y+1), border)
		c.text(r.Min.X+6, y+4, format(lo+(hi-lo)*float64(i)/4, unit), dim, 1)
	}
	span := c.end.Sub(c.start).Seconds()
	for i := 0; i <= 3; i++ {
		x := plot.Min.X + i*plot.Dx()/3
		c.text(x-14, plot.Max.Y+14, c.start.Add(time.Duration(float64(i)/3*span*float64(time.Second))).UTC().Format("15:04"), dim, 1)
	}
	lx := plot.Min.X
	for i, s := range series {
		col := palette[i%len(palette)]
		var px, py int
		first := true
		for _, pt := range s.points {
			if math.IsNaN(pt.v) || math.IsInf(pt.v, 0) {
				first = true
				continue
			}
			x := plot.Min.X + int(pt.t.Sub(c.start).Seconds()/span*float64(plot.Dx()))
			y := plot.Max.Y - int((pt.v-lo)/(hi-lo)*float64(plot.Dy()))
			if !first {
				c.line(px, py, x, y, col)
			}
			px, py, first = x, y, false
		}
		if lx+16+7*len(s.name) > r.Max.X-8 { // no room left on the legend's line
			c.text(lx, r.Max.Y-11, "...", text, 1)
			continue
		}
		c.rect(image.Rect(lx, r.Max.Y-18, lx+12, r.Max.Y-14), col)
		c.text(lx+16, r.Max.Y-11, s.name, text, 1)
		lx += 16 + 7*len(s.name) + 16
	}
}

// line draws a two-pixel wide segment (Bresenham).
func (c *canvas) line(x0, y0, x1, y1 int, col color.Color) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := cmp.Compare(x1, x0), cmp.Compare(y1, y0)
	e := dx + dy
	for {
		c.rgba.Set(x0, y0, col)
		c.rgba.Set(x0, y0+1, col)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			x0 += sx
		}
		if e2 <= dx {
			e += dx
			y0 += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

// format writes v in the panel's unit, as Grafana would roughly.
func format(v float64, unit string) string {
	switch unit {
	case "s":
		switch {
		case v == 0:
			return "0 s"
		case v < 1:
			return fmt.Sprintf("%.1f ms", v*1000)
		}
		return fmt.Sprintf("%.2f s", v)
	case "bytes":
		return fmt.Sprintf("%.1f MiB", v/(1<<20))
	case "ops":
		return strconv.FormatFloat(v, 'g', 3, 64) + "/s"
	}
	if v == math.Trunc(v) {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}
