package repair

import (
	"fmt"
	"sync/atomic"
)

// Action is what the controller did (or tried) with a broken pod; it is the
// counters' "type" label, Istio's values.
type Action string

const (
	ActionRepair Action = "repair"
	ActionDelete Action = "delete"
	ActionLabel  Action = "label"
)

// Result is the counters' "result" label, Istio's values.
type Result string

const (
	ResultSuccess Result = "success"
	ResultFail    Result = "fail"
	ResultSkip    Result = "skip"
)

// Actions and Results are every value of the labels, in the counters' order.
var (
	Actions = []Action{ActionRepair, ActionDelete, ActionLabel}
	Results = []Result{ResultSuccess, ResultFail, ResultSkip}
)

// MetricPodsRepaired is Istio's counter name, with labels type and result.
const MetricPodsRepaired = "istio_cni_repair_pods_repaired_total"

// Ours.
const (
	MetricBrokenDetected = "istio_cni_repair_broken_pods_detected_total"
	MetricRetries        = "istio_cni_repair_retries_total"
	MetricGaveUp         = "istio_cni_repair_gave_up_total"
	MetricNetnsScans     = "istio_cni_repair_netns_scans_total"
	MetricMissingNetwork = "istio_cni_repair_missing_multus_network_total"
	MetricNotCaptured    = "istio_cni_repair_not_captured_total"
	MetricStaticPods     = "istio_cni_repair_static_pods_not_deleted_total"
)

// Metrics are the controller's counters. They are plain atomics; the agent exports
// them under the Metric* names.
type Metrics struct {
	repaired [3][3]atomic.Uint64 // [action][result]
	// Detected counts reconciles of broken pods (a pod is seen again on each change
	// until it is fixed).
	Detected atomic.Uint64
	// Retries counts attempts re-queued after a failure.
	Retries atomic.Uint64
	// GaveUp counts pods dropped after MaxRetries failed attempts.
	GaveUp atomic.Uint64
	// NetnsScans counts searches for a pod's network namespace.
	NetnsScans atomic.Uint64
	// MissingNetwork counts broken pods reported for a Multus networks annotation
	// that does not name the plugin's network (once per pod).
	MissingNetwork atomic.Uint64
	// NotCaptured counts broken pods reported because the plugin skips them (once
	// per pod).
	NotCaptured atomic.Uint64
	// StaticPods counts broken static pods reported instead of deleted (once per
	// pod): deleting a mirror pod does not restart it.
	StaticPods atomic.Uint64
}

func index[T comparable](list []T, v T) int {
	for i, x := range list {
		if x == v {
			return i
		}
	}
	panic(fmt.Sprintf("repair: unknown label value %v", v))
}

func (m *Metrics) count(a Action, r Result) {
	m.repaired[index(Actions, a)][index(Results, r)].Add(1)
}

// PodsRepaired is the istio_cni_repair_pods_repaired_total counter for a and r.
func (m *Metrics) PodsRepaired(a Action, r Result) uint64 {
	return m.repaired[index(Actions, a)][index(Results, r)].Load()
}
