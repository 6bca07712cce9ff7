package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/common/expfmt"

	"github.com/istio-cni/istio-cni/internal/nad"
	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/internal/pluginlog"
	"github.com/istio-cni/istio-cni/internal/podcache"
	"github.com/istio-cni/istio-cni/internal/repair"
	"github.com/istio-cni/istio-cni/internal/taint"
	"github.com/istio-cni/istio-cni/test/harness/repo"
)

var promtoolOnce struct {
	sync.Once
	path string
	err  error
	out  []byte
}

// promtool returns the pinned promtool, built into the cache on first use by
// `hack/tools/install.sh promtool` (as make test does beforehand).
func promtool(t testing.TB) string {
	t.Helper()
	promtoolOnce.Do(func() {
		root, err := repo.Root()
		if err != nil {
			promtoolOnce.err = err
			return
		}
		cmd := exec.Command(filepath.Join(root, "hack/tools/install.sh"), "promtool")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		promtoolOnce.path, promtoolOnce.err, promtoolOnce.out = filepath.Join(strings.TrimSpace(string(out)), "promtool"), err, stderr.Bytes()
	})
	if promtoolOnce.err != nil {
		t.Fatalf("hack/tools/install.sh promtool: %v\n%s", promtoolOnce.err, promtoolOnce.out)
	}
	return promtoolOnce.path
}

// checkPromtool runs `promtool check metrics` on an exposition: it parses it and
// lints it (names, units, HELP, counters' _total); any finding fails the test.
func checkPromtool(t testing.TB, exposition []byte) {
	t.Helper()
	cmd := exec.Command(promtool(t), "check", "metrics")
	cmd.Stdin = bytes.NewReader(exposition)
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

// gatherText renders every metric of m in the text format, as /metrics does.
func gatherText(t testing.TB, m *metrics) []byte {
	t.Helper()
	mfs, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

// istioCNISeries keeps the istio_cni_* and istio_build lines of an exposition
// (go_* and process_* change from run to run).
func istioCNISeries(exposition []byte) []byte {
	var out bytes.Buffer
	for line := range strings.SplitSeq(string(exposition), "\n") {
		name := line
		if rest, ok := strings.CutPrefix(line, "# HELP "); ok {
			name = rest
		} else if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name = rest
		}
		if strings.HasPrefix(name, "istio_cni_") || strings.HasPrefix(name, "istio_build ") || strings.HasPrefix(name, "istio_build{") {
			out.WriteString(line + "\n")
		}
	}
	return out.Bytes()
}

// TestEveryMetricHasHelpTypeAndPassesPromtool: the agent's metrics with every
// controller's registered, after some counts, match the golden exposition (names,
// labels, help, types; the README's table is written from it) and pass promtool.
func TestEveryMetricHasHelpTypeAndPassesPromtool(t *testing.T) {
	m := newMetrics()
	var (
		r  repair.Metrics
		tm taint.Metrics
		nm nad.Metrics
		pw podcache.WaitCounts
	)
	m.register(podCacheMetrics(func() bool { return true }, &pw)...)
	m.register(repairMetrics(&r)...)
	m.register(taintMetrics(&tm)...)
	m.register(multusMetrics(&nm)...)
	m.setReady(true)
	m.installs.WithLabelValues(installSuccess).Inc()
	m.installFailed(installConfigFailure)
	m.reinserts.Inc()
	m.pluginEvent(pluginlog.Event{Command: "ADD", Outcome: pluginlog.OutcomeRedirected, Seconds: 0.004})
	m.pluginEvent(pluginlog.Event{Command: "ADD", Outcome: pluginlog.OutcomeFailed, Reason: pluginlog.ReasonPodLookup, Seconds: 2})
	m.pluginEvent(pluginlog.Event{Command: "ADD", Outcome: "made-up", Reason: "made-up", Seconds: 0.1})
	m.pluginEvent(pluginlog.Event{Command: "ADD", Outcome: pluginlog.OutcomeFailed, Reason: "made-up", Seconds: 0.1})
	tm.Leadership.Leading.Store(true)
	nm.Created.Add(3)
	pw.Found.Add(2)
	pw.TimedOut.Add(1)

	text := gatherText(t, m)
	checkGolden(t, "metrics.txt", istioCNISeries(text))
	checkPromtool(t, text)
	for _, family := range []string{"go_goroutines", "go_memstats_heap_alloc_bytes", "process_resident_memory_bytes", "process_open_fds"} {
		if !bytes.Contains(text, []byte("\n"+family+" ")) {
			t.Errorf("no %s in the exposition", family)
		}
	}
}

// TestPromtoolFindsABrokenExposition proves the check can fail: a counter without
// _total and a series without HELP are findings.
func TestPromtoolFindsABrokenExposition(t *testing.T) {
	cmd := exec.Command(promtool(t), "check", "metrics")
	cmd.Stdin = strings.NewReader("# TYPE istio_cni_installs counter\nistio_cni_installs 1\n")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Errorf("promtool accepted a counter without _total and HELP: %s", out)
	}
}

func TestClassifyPluginRecordReadsTheOutcomeOfDel(t *testing.T) {
	cases := []struct {
		rec              string
		command, outcome string
		isEvent          bool
	}{
		{`{"level":"INFO","msg":"DEL: done","command":"DEL"}`, "DEL", "done", true},
		{`{"level":"DEBUG","msg":"DEL: network namespace already gone","command":"DEL"}`, "DEL", "nothing_to_do", true},
		{`{"level":"WARN","msg":"DEL: cleanup incomplete","command":"DEL"}`, "", "", false},
		// ADD outcomes come from the plugin's events, not from its records.
		{`{"level":"INFO","msg":"ADD: traffic redirected to the sidecar","command":"ADD","pod":"a/b"}`, "", "", false},
		{`{"level":"INFO","msg":"CHECK: rules match","command":"CHECK"}`, "", "", false},
		{`not json`, "", "", false},
	}
	for _, tc := range cases {
		cmd, outcome, ok := classifyPluginRecord([]byte(tc.rec))
		if cmd != tc.command || outcome != tc.outcome || ok != tc.isEvent {
			t.Errorf("%s: got %q %q %v, want %q %q %v", tc.rec, cmd, outcome, ok, tc.command, tc.outcome, tc.isEvent)
		}
	}
}

// istioPluginPost is what Istio's plugin sends at the end of a command (its
// pkg/log udsCore): POST http://unix/log on <run dir>/log.sock, a JSON array of
// strings, each one record of zap's JSON encoder with Istio's keys (time in UTC
// with microseconds, lower-case level, msg, then the fields).
func istioPluginPost(t testing.TB, sock string, records ...string) *http.Response {
	t.Helper()
	body, err := json.Marshal(records)
	if err != nil {
		t.Fatal(err)
	}
	c := http.Client{
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}},
		Timeout: time.Second, // Istio's client's
	}
	resp, err := c.Post("http://unix"+pluginlog.IstioLogPath, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("post to %s as Istio's plugin does: %v", sock, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func TestIstioRecordsBecomeTheAgentsLines(t *testing.T) {
	lines, err := istioRecords([]byte(`["{\"level\":\"info\",\"time\":\"2026-11-25T16:00:00.123456Z\",\"msg\":\"Checking pod\",\"pod\":\"app/web\",\"netns\":\"/proc/1/ns/net\"}",` +
		`"{\"level\":\"error\",\"time\":\"2026-11-25T16:00:00.2Z\",\"msg\":\"  failed  \",\"attempt\":{\"n\": 2}}", "not json", "null"]`))
	if err != nil {
		t.Fatal(err)
	}
	var got []map[string]any
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil || bytes.ContainsRune(l, '\n') {
			t.Fatalf("line %q is not one JSON record: %v", l, err)
		}
		delete(m, "time")
		got = append(got, m)
	}
	want := []map[string]any{
		{"level": "INFO", "msg": "Checking pod", "pod": "app/web", "netns": "/proc/1/ns/net", "plugin": "istio"},
		{"level": "ERROR", "msg": "  failed  ", "attempt": map[string]any{"n": 2.0}, "plugin": "istio"},
		{"msg": "not json", "plugin": "istio"},
		{"msg": "null", "plugin": "istio"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
	if !bytes.HasPrefix(lines[0], []byte(`{"time":"2026-11-25T16:00:00.123456Z","level":"INFO","msg":"Checking pod",`)) {
		t.Errorf("time, level and msg do not come first: %s", lines[0])
	}
	if _, err := istioRecords([]byte(`{"msg":"an object, not an array"}`)); err == nil {
		t.Error("an object was accepted")
	}
}

// TestAgentMetricsAndLogsFromBothPlugins runs a real agent (standalone mode), the
// real plugin through libcni in a real network namespace (one ADD passed through,
// three failing: a malformed CNI_ARGS, a config that does not parse, a config of a
// CNI version the plugin does not speak), and posts to the agent what Istio's plugin posts; then it scrapes
// /metrics: the ADDs' latency and failure reason are there, the exposition passes
// promtool, and both plugins' lines are on the agent's stdout.
func TestAgentMetricsAndLogsFromBothPlugins(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeCalico(t)
	p := n.startAgent(t, "CHAINED_CNI_PLUGIN=false", "EXCLUDE_NAMESPACES=kube-system")
	p.waitReady(t)
	conf, err := libcni.ConfFromFile(filepath.Join(n.confDir, DefaultStandaloneName))
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{n.binDir}, t.TempDir(), nil)
	passed := &libcni.RuntimeConf{ContainerID: "0123456789abcdef", NetNS: newNetns(t), IfName: "eth0",
		Args: [][2]string{{"K8S_POD_NAMESPACE", "kube-system"}, {"K8S_POD_NAME", "coredns-1"}}}
	if _, err := cni.AddNetwork(context.Background(), conf, passed); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	// CNI_ARGS "K8S_POD_NAMESPACE=apps;K8S_POD_NAME=web;junk": a pair that is not
	// KEY=VALUE fails the ADD at its first step.
	badArgs := &libcni.RuntimeConf{ContainerID: "fedcba9876543210", NetNS: newNetns(t), IfName: "eth0",
		Args: [][2]string{{"K8S_POD_NAMESPACE", "apps"}, {"K8S_POD_NAME", "web;junk"}}}
	if _, err := cni.AddNetwork(context.Background(), conf, badArgs); err == nil || !strings.Contains(err.Error(), "is not KEY=VALUE") {
		t.Fatalf("ADD with a malformed CNI_ARGS: %v, want the plugin's refusal", err)
	}

	// conf with one key changed, and a sandbox of pod apps/web with container id.
	changed := func(key string, value any, id string) (*libcni.NetworkConfig, *libcni.RuntimeConf) {
		t.Helper()
		var m map[string]any
		if err := json.Unmarshal(conf.Bytes, &m); err != nil {
			t.Fatal(err)
		}
		m[key] = value
		data, _ := json.Marshal(m)
		c, err := libcni.ConfFromBytes(data)
		if err != nil {
			t.Fatal(err)
		}
		return c, &libcni.RuntimeConf{ContainerID: id, NetNS: newNetns(t), IfName: "eth0",
			Args: [][2]string{{"K8S_POD_NAMESPACE", "apps"}, {"K8S_POD_NAME", "web"}}}
	}

	// A config that does not parse: the ADD fails before the plugin knows its log
	// options, and the agent still hears of it (the run dir is read from what
	// decodes), so the failure is counted as reason config.
	brokenConf, badConf := changed("iptables_mode", "bogus", "0a1b2c3d4e5f6789")
	if _, err := cni.AddNetwork(context.Background(), brokenConf, badConf); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("ADD with iptables_mode bogus: %v, want the plugin's refusal naming the value", err)
	}

	// A config of a version the plugin does not speak: the dispatch refuses it before
	// the plugin's ADD runs, and the agent hears of it all the same (reason config).
	oldConf, oldVersion := changed("cniVersion", "0.2.0", "0b1b2c3d4e5f6790")
	if _, err := cni.AddNetwork(context.Background(), oldConf, oldVersion); err == nil || !strings.Contains(err.Error(), "incompatible CNI versions") {
		t.Fatalf("ADD with cniVersion 0.2.0: %v, want the plugin's refusal", err)
	}

	istioSock := filepath.Join(n.runDir, plugin.IstioLogSocketName)
	resp := istioPluginPost(t, istioSock,
		`{"level":"info","time":"2026-11-25T16:00:00.123456Z","msg":"istio-cni cmdAdd podName: web","pod":"apps/web"}`,
		`{"level":"debug","time":"2026-11-25T16:00:00.123500Z","msg":"Setting up redirect"}`)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the agent answered Istio's plugin %s", resp.Status)
	}

	eventually(t, 5*time.Second, "the four ADDs are counted", func() bool {
		return p.metric(t, `istio_cni_plugin_add_duration_seconds_count{outcome="passed_through"}`) == 1 &&
			p.metric(t, `istio_cni_plugin_add_failures_total{reason="cni_args"}`) == 1 &&
			p.metric(t, `istio_cni_plugin_add_failures_total{reason="config"}`) == 2
	})
	for series, want := range map[string]float64{
		`istio_cni_plugin_events_total{command="ADD",outcome="passed_through"}`: 1,
		`istio_cni_plugin_events_total{command="ADD",outcome="failed"}`:         3,
		`istio_cni_plugin_add_duration_seconds_count{outcome="failed"}`:         3,
		`istio_cni_plugin_add_duration_seconds_count{outcome="redirected"}`:     0,
		`istio_cni_plugin_add_failures_total{reason="pod_lookup"}`:              0,
		`istio_cni_plugin_log_records_total{protocol="http"}`:                   2,
		`istio_cni_installs_total{result="SUCCESS"}`:                            1,
		`istio_cni_install_ready`:                                               1,
	} {
		if got := p.metric(t, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	// The latency is the plugin's own measure: more than nothing, less than the
	// ADD's whole run as this test saw it.
	if sum := p.metric(t, `istio_cni_plugin_add_duration_seconds_sum{outcome="passed_through"}`); sum <= 0 || sum > 10 {
		t.Errorf("ADD latency sum = %v s", sum)
	}

	scrape := p.scrape(t)
	checkPromtool(t, scrape)
	for _, family := range []string{"go_goroutines", "process_resident_memory_bytes", "process_cpu_seconds_total"} {
		if !bytes.Contains(scrape, []byte("\n"+family+" ")) {
			t.Errorf("no %s in the agent's /metrics", family)
		}
	}

	out := p.stdout.String()
	for _, want := range []string{`"msg":"ADD: pod passed through"`, `"msg":"istio-cni cmdAdd podName: web","plugin":"istio","pod":"apps/web"`,
		`"msg":"ADD failed","command":"ADD","containerID":"0b1b2c3d4e5f","netns":`,
		`"level":"DEBUG","msg":"Setting up redirect","plugin":"istio"`} {
		if !strings.Contains(out, want) {
			t.Errorf("agent stdout lacks %s:\n%s", want, out)
		}
	}
	p.stop(t)
	for _, s := range []string{plugin.IstioLogSocketName, plugin.LogSocketName, plugin.DatagramLogSocketName} {
		if _, err := os.Lstat(filepath.Join(n.runDir, s)); !os.IsNotExist(err) {
			t.Errorf("%s left behind: %v", s, err)
		}
	}
}

// TestBindAddressesKeepEachServerOnItsAddress: with MONITORING_ADDRESS and
// READINESS_ADDRESS set, each server answers on its address and on no other.
func TestBindAddressesKeepEachServerOnItsAddress(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeCalico(t)
	p := n.startAgent(t, "MONITORING_ADDRESS=127.0.0.2", "READINESS_ADDRESS=127.0.0.3")
	addrs := map[string]string{}
	for _, m := range regexp.MustCompile(`serves=(\w+) addr=(\S+)`).FindAllStringSubmatch(p.stderr.String(), -1) {
		addrs[m[1]] = m[2]
	}
	mhost, mport, _ := net.SplitHostPort(addrs["metrics"])
	phost, pport, _ := net.SplitHostPort(addrs["probes"])
	if mhost != "127.0.0.2" || phost != "127.0.0.3" {
		t.Fatalf("servers listen on %v, want metrics on 127.0.0.2 and probes on 127.0.0.3", addrs)
	}
	get := func(host, port, path string) error {
		c := http.Client{Timeout: 2 * time.Second}
		resp, err := c.Get("http://" + net.JoinHostPort(host, port) + path)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := get("127.0.0.2", mport, "/metrics"); err != nil {
		t.Errorf("/metrics on its address: %v", err)
	}
	if err := get("127.0.0.3", pport, "/healthz"); err != nil {
		t.Errorf("/healthz on its address: %v", err)
	}
	for _, other := range []string{"127.0.0.1", "127.0.0.3"} {
		if err := get(other, mport, "/metrics"); err == nil {
			t.Errorf("/metrics answers on %s too", other)
		}
	}
	if err := get("127.0.0.1", pport, "/healthz"); err == nil {
		t.Error("/healthz answers on 127.0.0.1 too")
	}
}

func (p *agentProc) scrape(t testing.TB) []byte {
	t.Helper()
	resp, err := http.Get(p.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// dashboardFile is the chart's Grafana dashboard.
const dashboardFile = "../../charts/istio-cni/dashboards/istio-cni.json"

// promQLWords are the PromQL functions, aggregations and keywords the dashboard's
// queries may use; any other bare name in a query is a metric without a selector,
// which this check refuses (every metric is written name{...} so that it can be
// found and checked).
var promQLWords = map[string]bool{
	"sum": true, "count": true, "max": true, "min": true, "avg": true, "by": true, "without": true, "or": true, "and": true,
	"unless": true, "rate": true, "increase": true, "irate": true, "histogram_quantile": true, "vector": true, "le": true,
}

var (
	// selectorRE finds metric names: an identifier followed by its label selector.
	selectorRE = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\{`)
	// stripRE drops metrics with their selectors (checked by selectorRE), quoted
	// strings, range durations and grouping label lists: what is left must be PromQL.
	stripRE   = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*\{[^}]*\}|"[^"]*"|\[[^\]]*\]|\b(by|without)\s*\([^)]*\)`)
	wordRE    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	variRE    = regexp.MustCompile(`\$\{?([a-zA-Z_][a-zA-Z0-9_]*)`)
	labelUsed = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
)

// dashboard is the part of Grafana's dashboard JSON model checked here.
type dashboard struct {
	Title         string `json:"title"`
	UID           string `json:"uid"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID      int    `json:"id"`
		Type    string `json:"type"`
		Title   string `json:"title"`
		GridPos struct {
			X, Y, W, H int
		} `json:"gridPos"`
		Datasource struct {
			Type string `json:"type"`
			UID  string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			RefID        string `json:"refId"`
			Expr         string `json:"expr"`
			LegendFormat string `json:"legendFormat"`
		} `json:"targets"`
	} `json:"panels"`
}

// checkDashboard validates the chart's dashboard: Grafana's JSON model (title, uid,
// panels with unique ids on the 24-column grid, a Prometheus data source, targets
// with refIds and queries, every $variable defined), and every metric its queries
// name is a series of scrape, the live /metrics of an agent.
func checkDashboard(t *testing.T, scrape []byte) {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.Title == "" || d.UID == "" || d.SchemaVersion < 30 || len(d.Panels) == 0 {
		t.Errorf("dashboard title %q uid %q schemaVersion %d, %d panels", d.Title, d.UID, d.SchemaVersion, len(d.Panels))
	}
	exported := map[string]bool{}
	for line := range strings.SplitSeq(string(scrape), "\n") {
		if line != "" && !strings.HasPrefix(line, "#") {
			exported[wordRE.FindString(line)] = true
		}
	}
	vars := map[string]bool{"__rate_interval": true, "__interval": true}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		where := "panel " + p.Title
		if p.ID == 0 || ids[p.ID] {
			t.Errorf("%s: id %d missing or repeated", where, p.ID)
		}
		ids[p.ID] = true
		if p.Title == "" || (p.Type != "timeseries" && p.Type != "stat") {
			t.Errorf("%s: type %q", where, p.Type)
		}
		if g := p.GridPos; g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("%s: gridPos %+v off Grafana's 24-column grid", where, g)
		}
		if p.Datasource.Type != "prometheus" {
			t.Errorf("%s: data source %+v, want prometheus", where, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no query", where)
		}
		refs := map[string]bool{}
		for _, q := range p.Targets {
			if q.RefID == "" || refs[q.RefID] || q.Expr == "" {
				t.Errorf("%s: target %+v: refId missing or repeated, or no expr", where, q)
			}
			refs[q.RefID] = true
			for _, m := range variRE.FindAllStringSubmatch(q.Expr+p.Datasource.UID, -1) {
				if !vars[m[1]] {
					t.Errorf("%s: $%s is not a dashboard variable", where, m[1])
				}
			}
			names := selectorRE.FindAllStringSubmatch(q.Expr, -1)
			if len(names) == 0 {
				t.Errorf("%s: %q names no metric", where, q.Expr)
			}
			for _, m := range names {
				if !exported[m[1]] {
					t.Errorf("%s: %q asks for %s, which the agent does not export", where, q.Expr, m[1])
				}
			}
			for _, w := range wordRE.FindAllString(stripRE.ReplaceAllString(q.Expr, " "), -1) {
				if !promQLWords[w] {
					t.Errorf("%s: %q: %q is neither a PromQL word nor a metric with a selector", where, q.Expr, w)
				}
			}
			for _, m := range labelUsed.FindAllStringSubmatch(q.LegendFormat, -1) {
				if m[1] != "instance" && !strings.Contains(q.Expr, m[1]) {
					t.Errorf("%s: legend {{%s}} is no label the query keeps", where, m[1])
				}
			}
		}
	}
}
