package agent

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
)

// metrics are the agent's Prometheus metrics, written in the text exposition
// format by hand: a handful of counters do not justify client_golang's dependency
// tree in a binary that sits on every node.
type metrics struct {
	mu       sync.Mutex
	ready    bool
	counters map[string]float64 // series ("name" or `name{labels}`) -> value
	// collectors are other parts' metrics (the pod cache, the repair and taint
	// controllers), read at each scrape.
	collectors []collector
}

// collector is a set of metrics kept elsewhere: collect returns every series by its
// Prometheus name (`name` or `name{labels}`), families documents each name.
type collector struct {
	families []metricFamily
	collect  func() map[string]float64
}

type metricFamily struct{ name, typ, help string }

// metricHelp documents every metric; only these are exposed, each always (a
// counter that is absent cannot be told from a broken scrape).
var metricHelp = []metricFamily{
	{"istio_cni_install_ready", "gauge", "1 when the CNI config holds the istio-cni entry and the watch is running."},
	{"istio_cni_installs_total", "counter", "Times the istio-cni entry was written into a CNI config that lacked it (first install included)."},
	{"istio_cni_config_reinserts_total", "counter", "Times the entry had to be put back after something removed it."},
	{"istio_cni_binary_installs_total", "counter", "Binaries copied into a CNI bin dir (first install and restores)."},
	{"istio_cni_kubeconfig_writes_total", "counter", "Times the plugin's kubeconfig was written (first install and token rotations)."},
	{"istio_cni_install_errors_total", "counter", "Failed install steps, by stage."},
	{"istio_cni_plugin_events_total", "counter", "Plugin ADD/DEL outcomes reported over the log socket."},
	{"istio_cni_plugin_log_records_total", "counter", "Log records received from the plugin."},
}

func newMetrics() *metrics { return &metrics{counters: map[string]float64{}} }

// addCollector exposes c's metrics after the agent's own. Families that c does not
// return at a scrape are left out of it.
func (m *metrics) addCollector(c collector) {
	m.mu.Lock()
	m.collectors = append(m.collectors, c)
	m.mu.Unlock()
}

func (m *metrics) add(name string, labels ...string) {
	m.mu.Lock()
	m.counters[series(name, labels...)]++
	m.mu.Unlock()
}

func (m *metrics) setReady(ready bool) {
	m.mu.Lock()
	m.ready = ready
	m.mu.Unlock()
}

// value is for tests and logs.
func (m *metrics) value(name string, labels ...string) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.counters[series(name, labels...)]
}

// series renders name{k="v",...} from alternating keys and values.
func series(name string, labels ...string) string {
	if len(labels) == 0 {
		return name
	}
	var b strings.Builder
	b.WriteString(name)
	b.WriteByte('{')
	for i := 0; i+1 < len(labels); i += 2 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=\"%s\"", labels[i], escapeLabel(labels[i+1]))
	}
	b.WriteByte('}')
	return b.String()
}

func escapeLabel(v string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(v)
}

// write renders every metric in the text exposition format (version 0.0.4).
func (m *metrics) write(w io.Writer) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var b strings.Builder
	for _, h := range metricHelp {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", h.name, h.help, h.name, h.typ)
		if h.name == "istio_cni_install_ready" {
			v := 0
			if m.ready {
				v = 1
			}
			fmt.Fprintf(&b, "%s %d\n", h.name, v)
			continue
		}
		var keys []string
		for k := range m.counters {
			if k == h.name || strings.HasPrefix(k, h.name+"{") {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		if len(keys) == 0 && !strings.HasSuffix(h.name, "_errors_total") && h.name != "istio_cni_plugin_events_total" {
			keys = []string{h.name} // unlabelled counters start at 0
		}
		for _, k := range keys {
			fmt.Fprintf(&b, "%s %g\n", k, m.counters[k])
		}
	}
	for _, c := range m.collectors {
		writeCollected(&b, c.families, c.collect())
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeCollected writes the series of each family in values, sorted, under its HELP
// and TYPE lines.
func writeCollected(b *strings.Builder, families []metricFamily, values map[string]float64) {
	for _, f := range families {
		var keys []string
		for k := range values {
			if k == f.name || strings.HasPrefix(k, f.name+"{") {
				keys = append(keys, k)
			}
		}
		if len(keys) == 0 {
			continue
		}
		slices.Sort(keys)
		fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s %s\n", f.name, f.help, f.name, f.typ)
		for _, k := range keys {
			fmt.Fprintf(b, "%s %g\n", k, values[k])
		}
	}
}
