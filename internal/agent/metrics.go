package agent

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/istio-cni/istio-cni/internal/lease"
	"github.com/istio-cni/istio-cni/internal/nad"
	"github.com/istio-cni/istio-cni/internal/pluginlog"
	"github.com/istio-cni/istio-cni/internal/podcache"
	"github.com/istio-cni/istio-cni/internal/repair"
	"github.com/istio-cni/istio-cni/internal/taint"
	"github.com/istio-cni/istio-cni/internal/version"
)

// Results of istio_cni_installs_total: Istio's label values.
const (
	installSuccess          = "SUCCESS"
	installBinariesFailure  = "COPY_BINARIES_FAILURE"
	installKubeconfigFailed = "CREATE_KUBECONFIG_FAILURE"
	installConfigFailure    = "CREATE_CNI_CONFIG_FAILURE"
)

// Protocols of istio_cni_plugin_log_records_total: the channel a record came in on.
const (
	protocolSeqpacket = "seqpacket" // this plugin, on pseq.sock
	protocolDatagram  = "datagram"  // plugins of earlier builds (and this one's fallback), on plog.sock
	protocolHTTP      = "http"      // Istio's plugin, on log.sock
)

// addDurationBuckets are the ADD latency histogram's upper bounds, in seconds: an
// ADD answered from the agent's pod cache takes a few milliseconds; one that asks
// the API server, tens; a pod lookup that retries, seconds up to its bound
// (plugin.MaxPodLookupBound).
var addDurationBuckets = []float64{0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// otherValue stands for a label value from a plugin's report that is outside the
// known set, so that a stray sender cannot grow the number of series.
const otherValue = "other"

// metrics are the agent's Prometheus metrics, in their own registry (no global
// state): Istio's names and labels where Istio has the metric, plus the Go
// runtime's and the process's.
type metrics struct {
	reg *prometheus.Registry

	ready            prometheus.Gauge
	installs         *prometheus.CounterVec
	reinserts        prometheus.Counter
	binaryInstalls   prometheus.Counter
	kubeconfigWrites prometheus.Counter
	contestDeferrals prometheus.Counter
	featureRestarts  *prometheus.CounterVec
	pluginEvents     *prometheus.CounterVec
	pluginRecords    *prometheus.CounterVec
	addDuration      *prometheus.HistogramVec
	addFailures      *prometheus.CounterVec
	tokenExpiry      prometheus.Gauge
	tokenFailures    prometheus.Counter
	tokenRefused     prometheus.Gauge
	backendUnusable  prometheus.Gauge
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		ready: gauge("istio_cni_install_ready",
			"1 when the CNI config holds the istio-cni entry, the binaries and the kubeconfig are in place, and the watch is running."),
		installs: counterVec("istio_cni_installs_total",
			"Install steps by result: SUCCESS counts writes of the istio-cni entry into a CNI config that lacked it (first install and re-inserts); COPY_BINARIES_FAILURE, CREATE_KUBECONFIG_FAILURE and CREATE_CNI_CONFIG_FAILURE count failed attempts.",
			"result"),
		reinserts: counter("istio_cni_config_reinserts_total",
			"Times the istio-cni entry had to be put back after something removed it from the CNI config."),
		binaryInstalls: counter("istio_cni_binary_installs_total",
			"Binaries copied into a CNI bin dir (first install and restores)."),
		kubeconfigWrites: counter("istio_cni_kubeconfig_writes_total",
			"Times the plugin's kubeconfig was written (first install and token rotations)."),
		featureRestarts: counterVec("istio_cni_agent_feature_restarts_total",
			"API server features (pod cache, repair controller, taint controller, ...) started again after they stopped with an error, by feature.",
			"feature"),
		contestDeferrals: counter("istio_cni_contested_writes_deferred_total",
			"Rewrites of the kubeconfig or the CNI config put off because another writer (a second istio-cni agent on the node) keeps changing them."),
		pluginEvents: counterVec("istio_cni_plugin_events_total",
			"Plugin command outcomes: ADD from the plugin's reports (redirected, passed_through, failed), DEL from its log records (done; nothing_to_do when the plugin logs at debug).",
			"command", "outcome"),
		pluginRecords: counterVec("istio_cni_plugin_log_records_total",
			"Plugin log records received, by protocol: seqpacket (this plugin), datagram (plugins of earlier builds) or http (Istio's plugin).",
			"protocol"),
		addDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "istio_cni_plugin_add_duration_seconds",
			Help:    "Run time of the plugin's ADD, from its start to its result, by outcome, as the plugin reports it.",
			Buckets: addDurationBuckets,
		}, []string{"outcome"}),
		addFailures: counterVec("istio_cni_plugin_add_failures_total",
			"Failed plugin ADDs by the step that failed (reason).",
			"reason"),
		tokenExpiry: gauge("istio_cni_plugin_token_expiry_timestamp_seconds",
			"When the plugin's current token (PLUGIN_SERVICE_ACCOUNT's, in its kubeconfig) expires, in seconds since the epoch; 0 before this agent's first token. Renewed at half its lifetime: an expiry less than that away means renewals are failing."),
		tokenFailures: counter("istio_cni_plugin_token_request_failures_total",
			"Failed TokenRequests for the plugin's token (its first and its renewals), each retried after 1 s doubling to 30 s."),
		backendUnusable: gauge("istio_cni_plugin_backend_unusable",
			"1 while the agent's node check finds that this node cannot run the plugin's rule backend (the plugin config's native_nftables and iptables_mode): a tool missing from the node, or a kernel that refuses a pod's rules in a throwaway network namespace; every meshed pod's ADD fails meanwhile and the agent is not ready. 0 otherwise, also where part of it could not be checked (the log says what)."),
		tokenRefused: gauge("istio_cni_plugin_token_refused",
			"1 while the API server is known to refuse the plugin's token (its ServiceAccount deleted or created again, or the token expired after failed renewals): the plugin's ADDs that ask the API server fail meanwhile."),
	}
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "istio_build",
		Help: "Istio's build info metric: 1 for the agent's component (cni) and build version (tag).",
	}, []string{"component", "tag"})
	build.WithLabelValues("cni", version.Version).Set(1)
	m.reg.MustRegister(
		build,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.ready, m.installs, m.reinserts, m.binaryInstalls, m.kubeconfigWrites, m.contestDeferrals, m.featureRestarts,
		m.pluginEvents, m.pluginRecords, m.addDuration, m.addFailures, m.tokenExpiry, m.tokenFailures, m.tokenRefused,
		m.backendUnusable,
	)
	// Every series an operator alerts on exists from the start at 0: a counter that
	// is absent cannot be told from a broken scrape.
	for _, r := range []string{installSuccess, installBinariesFailure, installKubeconfigFailed, installConfigFailure} {
		m.installs.WithLabelValues(r)
	}
	for _, p := range []string{protocolSeqpacket, protocolDatagram, protocolHTTP} {
		m.pluginRecords.WithLabelValues(p)
	}
	for _, o := range addOutcomes {
		m.pluginEvents.WithLabelValues("ADD", o)
		m.addDuration.WithLabelValues(o)
	}
	for _, r := range pluginlog.Reasons {
		m.addFailures.WithLabelValues(r)
	}
	return m
}

var addOutcomes = []string{pluginlog.OutcomeRedirected, pluginlog.OutcomePassedThrough, pluginlog.OutcomeFailed}

func (m *metrics) setReady(ready bool) { m.ready.Set(boolGauge(ready)) }

// installFailed counts a failed install step (one of the install*Failure results).
func (m *metrics) installFailed(result string) { m.installs.WithLabelValues(result).Inc() }

// pluginEvent counts one ADD reported by the plugin. Values outside the known sets
// are counted as "other".
func (m *metrics) pluginEvent(e pluginlog.Event) {
	if e.Command != "ADD" {
		return
	}
	outcome := known(e.Outcome, addOutcomes)
	m.pluginEvents.WithLabelValues("ADD", outcome).Inc()
	if e.Seconds >= 0 {
		m.addDuration.WithLabelValues(outcome).Observe(e.Seconds)
	}
	if outcome == pluginlog.OutcomeFailed {
		m.addFailures.WithLabelValues(known(e.Reason, pluginlog.Reasons)).Inc()
	}
}

func known(v string, set []string) string {
	if slices.Contains(set, v) {
		return v
	}
	return otherValue
}

// register adds a controller's metrics; each family is exposed only while its
// controller runs.
func (m *metrics) register(cs ...prometheus.Collector) { m.reg.MustRegister(cs...) }

func gauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
}

func counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

func counterFunc(name, help string, v func() uint64) prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v()) })
}

func gaugeFunc(name, help string, v func() bool) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return boolGauge(v()) })
}

// leadershipMetrics are <prefix>_leader and <prefix>_elected_total of a leased
// controller.
func leadershipMetrics(prefix, what string, l *lease.Leadership) []prometheus.Collector {
	return []prometheus.Collector{
		gaugeFunc(prefix+"_leader", "1 while this agent holds the "+what+" lease.", l.Leading.Load),
		counterFunc(prefix+"_elected_total", "Times this agent became the "+what+" leader.", l.Elected.Load),
	}
}

func podCacheMetrics(synced func() bool, waits *podcache.WaitCounts) []prometheus.Collector {
	return []prometheus.Collector{
		gaugeFunc("istio_cni_pod_cache_synced",
			"1 while the pod cache serves this node's pods on its socket, once it has listed them (the plugin asks the API server otherwise).", synced),
		counterFunc("istio_cni_pod_cache_waits_found_total",
			"Plugin requests for a pod the cache did not hold yet, answered once the pod's event came.", waits.Found.Load),
		counterFunc("istio_cni_pod_cache_waits_timed_out_total",
			"Plugin requests for a pod the cache did not hold, answered without it at the end of their wait (the plugin then asks the API server).", waits.TimedOut.Load),
	}
}

func repairMetrics(r *repair.Metrics) []prometheus.Collector {
	return []prometheus.Collector{
		repairedCollector{r},
		counterFunc(repair.MetricBrokenDetected, "Reconciles of pods found broken (a pod counts again on each change until it is fixed).", r.Detected.Load),
		counterFunc(repair.MetricRetries, "Repair attempts re-queued after a failure.", r.Retries.Load),
		counterFunc(repair.MetricGaveUp, "Broken pods given up on after REPAIR_MAX_RETRIES attempts.", r.GaveUp.Load),
		counterFunc(repair.MetricNetnsScans, "Searches for a broken pod's network namespace (repair in place).", r.NetnsScans.Load),
		counterFunc(repair.MetricMissingNetwork, "Broken pods reported (once each) for a Multus networks annotation that does not name the plugin.", r.MissingNetwork.Load),
		counterFunc(repair.MetricNotCaptured, "Broken pods reported (once each), not deleted, because the plugin skips them (excluded namespace, inject=false...).", r.NotCaptured.Load),
		counterFunc(repair.MetricStaticPods, "Broken static pods reported (once each), not deleted: deleting a mirror pod does not restart its static pod.", r.StaticPods.Load),
	}
}

// repairedCollector exposes Istio's istio_cni_repair_pods_repaired_total{type,result}
// from the repair controller's counters, every pair always.
type repairedCollector struct{ m *repair.Metrics }

var repairedDesc = prometheus.NewDesc(repair.MetricPodsRepaired,
	"Broken pods acted on by the repair controller, by action (type: repair, delete, label) and result (success, fail, skip).",
	[]string{"type", "result"}, nil)

func (c repairedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- repairedDesc }

func (c repairedCollector) Collect(ch chan<- prometheus.Metric) {
	for _, a := range repair.Actions {
		for _, r := range repair.Results {
			ch <- prometheus.MustNewConstMetric(repairedDesc, prometheus.CounterValue,
				float64(c.m.PodsRepaired(a, r)), string(a), string(r))
		}
	}
}

func taintMetrics(t *taint.Metrics) []prometheus.Collector {
	return append([]prometheus.Collector{
		counterFunc("istio_cni_taint_added_total", "Nodes given the readiness taint.", t.TaintsAdded.Load),
		counterFunc("istio_cni_taint_removed_total", "Nodes whose readiness taint was removed.", t.TaintsRemoved.Load),
		counterFunc("istio_cni_taint_patch_failures_total", "Node taint patches that failed (and were retried).", t.PatchFailures.Load),
	}, leadershipMetrics("istio_cni_taint", "node readiness", &t.Leadership)...)
}

func multusMetrics(n *nad.Metrics) []prometheus.Collector {
	return append([]prometheus.Collector{
		counterFunc("istio_cni_multus_nad_created_total", "NetworkAttachmentDefinitions created in meshed namespaces.", n.Created.Load),
		counterFunc("istio_cni_multus_nad_create_failures_total", "NetworkAttachmentDefinition creates that failed (and were retried).", n.CreateFailures.Load),
	}, leadershipMetrics("istio_cni_multus", "Multus", &n.Leadership)...)
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
