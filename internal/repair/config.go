package repair

import (
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/istio-cni/istio-cni/internal/informer"
	"github.com/istio-cni/istio-cni/internal/multus"
	"github.com/istio-cni/istio-cni/internal/settings"
)

// Environment variables, Istio's names (install-cni's repair-* flags) unless marked
// as ours.
const (
	EnvEnabled            = "REPAIR_ENABLED"
	EnvRepairPods         = "REPAIR_REPAIR_PODS"
	EnvDeletePods         = "REPAIR_DELETE_PODS"
	EnvLabelPods          = "REPAIR_LABEL_PODS"
	EnvLabelKey           = "REPAIR_BROKEN_POD_LABEL_KEY"
	EnvLabelValue         = "REPAIR_BROKEN_POD_LABEL_VALUE"
	EnvNodeName           = "REPAIR_NODE_NAME"
	EnvSidecarAnnotation  = "REPAIR_SIDECAR_ANNOTATION"
	EnvInitContainerName  = "REPAIR_INIT_CONTAINER_NAME"
	EnvInitTerminationMsg = "REPAIR_INIT_CONTAINER_TERMINATION_MESSAGE"
	EnvInitExitCode       = "REPAIR_INIT_CONTAINER_EXIT_CODE"
	EnvLabelSelectors     = "REPAIR_LABEL_SELECTORS"
	EnvFieldSelectors     = "REPAIR_FIELD_SELECTORS"

	// Ours.
	EnvMaxRetries    = "REPAIR_MAX_RETRIES"
	EnvRetryBase     = "REPAIR_RETRY_BASE_DELAY"
	EnvRetryMax      = "REPAIR_RETRY_MAX_DELAY"
	EnvProcDir       = "REPAIR_PROC_DIR"
	EnvNetnsDirs     = "REPAIR_NETNS_DIRS"
	EnvNodeNameAgent = "NODE_NAME" // the agent's own node, used when REPAIR_NODE_NAME is unset
)

// Defaults, Istio's where Istio has one.
const (
	DefaultLabelKey          = "cni.istio.io/uninitialized"
	DefaultLabelValue        = "true"
	DefaultSidecarAnnotation = "sidecar.istio.io/status"
	DefaultInitContainerName = "istio-validation"
	// DefaultInitExitCode is istio-iptables' validation failure code.
	DefaultInitExitCode = 126
	// DefaultMaxRetries is Istio's attempt limit for a pod (its queue's WithMaxAttempts(5)).
	DefaultMaxRetries = 5
	DefaultRetryBase  = 200 * time.Millisecond
	DefaultRetryMax   = 30 * time.Second
	// DefaultProcDir is where Istio's install-cni reads the node's /proc, and where
	// its chart mounts it: the agent's own /proc shows only its container's processes.
	DefaultProcDir  = "/host/proc"
	DefaultNetnsDir = "/var/run/netns"
)

// Config is the repair controller's settings. Get one from DefaultConfig or
// ConfigFromEnv and check it with Validate (New does).
type Config struct {
	// Enabled runs the controller at all (REPAIR_ENABLED, default true).
	Enabled bool
	// Idle says REPAIR_ENABLED is true but every action is off (REPAIR_REPAIR_PODS,
	// REPAIR_DELETE_PODS and REPAIR_LABEL_PODS false), which Istio's install-cni
	// accepts and then does nothing with a broken pod: ConfigFromEnv sets Enabled
	// false instead, and the agent says why at start.
	Idle bool
	// RepairPods programs the capture into a broken pod's running network namespace
	// (REPAIR_REPAIR_PODS, default true). It takes precedence over DeletePods and
	// LabelPods, which remain fallbacks when an in-place repair cannot work.
	RepairPods bool
	// DeletePods deletes a broken pod so its controller recreates it
	// (REPAIR_DELETE_PODS, default false). Takes precedence over LabelPods.
	DeletePods bool
	// LabelPods labels a broken pod LabelKey=LabelValue (REPAIR_LABEL_PODS, default false).
	LabelPods  bool
	LabelKey   string // REPAIR_BROKEN_POD_LABEL_KEY, default cni.istio.io/uninitialized
	LabelValue string // REPAIR_BROKEN_POD_LABEL_VALUE, default "true"
	// NodeName is the node whose pods are watched (REPAIR_NODE_NAME, else NODE_NAME).
	// Required: the controller never watches the whole cluster.
	NodeName string
	// AgentNode is the agent's own node (NODE_NAME), where an in-place repair looks
	// for network namespaces: RepairPods needs NodeName to be it.
	AgentNode string
	// SidecarAnnotation marks injected pods; pods without it are never broken
	// (REPAIR_SIDECAR_ANNOTATION, default sidecar.istio.io/status; empty: any pod).
	SidecarAnnotation string
	// InitContainerName is the validation init container (REPAIR_INIT_CONTAINER_NAME,
	// default istio-validation; empty: any init container).
	InitContainerName string
	// InitTerminationMsg, when not empty, must equal the container's termination
	// message, both trimmed (REPAIR_INIT_CONTAINER_TERMINATION_MESSAGE).
	InitTerminationMsg string
	// InitExitCode is the exit code that means "not redirected"
	// (REPAIR_INIT_CONTAINER_EXIT_CODE, default 126; 0: any non-zero code).
	InitExitCode int
	// LabelSelector and FieldSelector narrow the watch further
	// (REPAIR_LABEL_SELECTORS, REPAIR_FIELD_SELECTORS); spec.nodeName is always added.
	LabelSelector string
	FieldSelector string

	// MaxRetries bounds the attempts per pod (ours: REPAIR_MAX_RETRIES, default 5).
	MaxRetries int
	// RetryBase and RetryMax shape the per-pod exponential back-off (ours:
	// REPAIR_RETRY_BASE_DELAY, REPAIR_RETRY_MAX_DELAY; defaults 200ms and 30s).
	RetryBase time.Duration
	RetryMax  time.Duration
	// ProcDir is the host's /proc as the agent sees it (ours: REPAIR_PROC_DIR,
	// default /host/proc, where Istio's chart mounts it and its install-cni reads it).
	ProcDir string
	// NetnsDirs hold bind-mounted network namespaces to search besides processes
	// (ours: REPAIR_NETNS_DIRS, comma-separated, default /var/run/netns).
	NetnsDirs []string
	// MultusNetwork, when set, says pods join the plugin through Multus by naming
	// this network in their k8s.v1.cni.cncf.io/networks annotation (the agent's
	// MULTUS_ENABLED and MULTUS_NETWORK_NAME). A broken pod whose annotation does not
	// name it is labelled and reported once, never deleted or repaired: the cause
	// is its annotation, not the race.
	MultusNetwork string
}

// DefaultConfig is Istio's default: enabled, repair in place, no node yet.
func DefaultConfig() Config {
	return Config{
		Enabled:           true,
		RepairPods:        true,
		LabelKey:          DefaultLabelKey,
		LabelValue:        DefaultLabelValue,
		SidecarAnnotation: DefaultSidecarAnnotation,
		InitContainerName: DefaultInitContainerName,
		InitExitCode:      DefaultInitExitCode,
		MaxRetries:        DefaultMaxRetries,
		RetryBase:         DefaultRetryBase,
		RetryMax:          DefaultRetryMax,
		ProcDir:           DefaultProcDir,
		NetnsDirs:         []string{DefaultNetnsDir},
	}
}

// ConfigFromEnv reads the settings through lookup (os.LookupEnv in the agent) over
// DefaultConfig and validates them. Every error names the variable and the value.
func ConfigFromEnv(lookup func(string) (string, bool)) (Config, error) {
	return settings.FromEnv(lookup, DefaultConfig(), func(r *settings.Reader, c *Config) {
		// Istio's switches, read as Istio's install-cni reads them: set but empty
		// is false.
		r.IstioSwitch(EnvEnabled, &c.Enabled)
		r.IstioSwitch(EnvRepairPods, &c.RepairPods)
		r.IstioSwitch(EnvDeletePods, &c.DeletePods)
		r.IstioSwitch(EnvLabelPods, &c.LabelPods)
		if c.Enabled && !c.RepairPods && !c.DeletePods && !c.LabelPods {
			// Istio's controller runs and does nothing with a broken pod; this one
			// is not started (Idle says why).
			c.Enabled, c.Idle = false, true
		}
		r.String(EnvLabelKey, &c.LabelKey)
		r.String(EnvLabelValue, &c.LabelValue)
		r.String(EnvNodeNameAgent, &c.NodeName)
		c.AgentNode = c.NodeName
		r.NonEmpty(EnvNodeName, &c.NodeName)
		r.String(EnvSidecarAnnotation, &c.SidecarAnnotation)
		r.String(EnvInitContainerName, &c.InitContainerName)
		if v, ok := lookup(EnvInitTerminationMsg); ok {
			c.InitTerminationMsg = v // compared trimmed; kept as given for messages
		}
		if v, ok := lookup(EnvInitExitCode); ok && strings.TrimSpace(v) == "" {
			c.InitExitCode = 0 // as Istio's install-cni reads it set but empty: any code
		} else {
			r.Int(EnvInitExitCode, &c.InitExitCode)
		}
		r.String(EnvLabelSelectors, &c.LabelSelector)
		r.String(EnvFieldSelectors, &c.FieldSelector)
		r.Int(EnvMaxRetries, &c.MaxRetries)
		r.Duration(EnvRetryBase, &c.RetryBase, "200ms or 30s")
		r.Duration(EnvRetryMax, &c.RetryMax, "200ms or 30s")
		r.String(EnvProcDir, &c.ProcDir)
		mode := multus.DefaultMode()
		mode.Read(r)
		if mode.Enabled {
			c.MultusNetwork = mode.Network
		}
		if v, ok := lookup(EnvNetnsDirs); ok {
			c.NetnsDirs = nil
			for _, d := range strings.Split(v, ",") {
				if d = strings.TrimSpace(d); d != "" {
					c.NetnsDirs = append(c.NetnsDirs, d)
				}
			}
		}
	})
}

// Validate checks every setting and reports all problems at once, each naming its
// environment variable. A disabled config is always valid.
func (c Config) Validate() error {
	if !c.Enabled {
		return nil
	}
	var p settings.Problems
	if !c.RepairPods && !c.DeletePods && !c.LabelPods {
		p.Add(EnvEnabled, "true, but %s, %s and %s are all false: nothing would be done with a broken pod (set one, or %s=false)",
			EnvRepairPods, EnvDeletePods, EnvLabelPods, EnvEnabled)
	}
	if c.NodeName == "" {
		p.Add(EnvNodeName, "empty (and %s is unset): the controller watches only its own node's pods and must know the node", EnvNodeNameAgent)
	} else if msgs := validation.IsDNS1123Subdomain(c.NodeName); len(msgs) > 0 {
		p.Add(EnvNodeName, "%q is not a node name: %s", c.NodeName, strings.Join(msgs, "; "))
	} else if c.RepairPods && c.AgentNode != "" && c.NodeName != c.AgentNode {
		// The namespace search reads this node's processes and mounts: another
		// node's pod is never there, and the pod holding its address here is not it.
		p.Add(EnvNodeName, "%q is another node than this agent's (%s=%q), and %s=true repairs pods in place, "+
			"in the network namespaces of this node only: watch this node, or set %s=false", c.NodeName, EnvNodeNameAgent, c.AgentNode, EnvRepairPods, EnvRepairPods)
	}
	if c.LabelPods || c.RepairPods || c.MultusNetwork != "" {
		// Repair removes the label again, and a pod missing its Multus network is
		// labelled whatever the action, so it must be a valid key then too.
		if msgs := validation.IsQualifiedName(c.LabelKey); len(msgs) > 0 {
			p.Add(EnvLabelKey, "%q is not a label key: %s", c.LabelKey, strings.Join(msgs, "; "))
		}
		if msgs := validation.IsValidLabelValue(c.LabelValue); len(msgs) > 0 {
			p.Add(EnvLabelValue, "%q is not a label value: %s", c.LabelValue, strings.Join(msgs, "; "))
		}
	}
	if c.SidecarAnnotation != "" {
		if msgs := validation.IsQualifiedName(c.SidecarAnnotation); len(msgs) > 0 {
			p.Add(EnvSidecarAnnotation, "%q is not an annotation key: %s", c.SidecarAnnotation, strings.Join(msgs, "; "))
		}
	}
	if c.InitContainerName != "" {
		if msgs := validation.IsDNS1123Label(c.InitContainerName); len(msgs) > 0 {
			p.Add(EnvInitContainerName, "%q is not a container name: %s", c.InitContainerName, strings.Join(msgs, "; "))
		}
	}
	if c.InitExitCode < 0 || c.InitExitCode > 255 {
		p.Add(EnvInitExitCode, "%d is not an exit code (0-255; 0 means any non-zero code)", c.InitExitCode)
	}
	if c.InitContainerName == "" && c.InitExitCode == 0 && strings.TrimSpace(c.InitTerminationMsg) == "" {
		p.Add(EnvInitContainerName, "empty, with %s=0 and no %s: any failed init container of any injected pod would count as broken",
			EnvInitExitCode, EnvInitTerminationMsg)
	}
	if _, err := labels.Parse(c.LabelSelector); err != nil {
		p.Add(EnvLabelSelectors, "%q is not a label selector: %v", c.LabelSelector, err)
	}
	if fs, err := fields.ParseSelector(c.FieldSelector); err != nil {
		p.Add(EnvFieldSelectors, "%q is not a field selector: %v", c.FieldSelector, err)
	} else {
		for _, r := range fs.Requirements() {
			if r.Field == "spec.nodeName" {
				p.Add(EnvFieldSelectors, "%q selects spec.nodeName, which the controller sets itself from %s", c.FieldSelector, EnvNodeName)
			}
		}
	}
	if c.MaxRetries < 1 || c.MaxRetries > 100 {
		p.Add(EnvMaxRetries, "%d is not between 1 and 100", c.MaxRetries)
	}
	if c.RetryBase <= 0 {
		p.Add(EnvRetryBase, "%s must be positive", c.RetryBase)
	}
	if c.RetryMax < c.RetryBase {
		p.Add(EnvRetryMax, "%s is shorter than %s (%s)", c.RetryMax, EnvRetryBase, c.RetryBase)
	}
	if c.RepairPods {
		if !filepath.IsAbs(c.ProcDir) {
			p.Add(EnvProcDir, "%q is not an absolute path", c.ProcDir)
		}
		for _, d := range c.NetnsDirs {
			if !filepath.IsAbs(d) {
				p.Add(EnvNetnsDirs, "%q is not an absolute path", d)
			}
		}
	}
	return p.Err()
}

// fieldSelector is the watch's field selector: always this node, plus the user's.
func (c Config) fieldSelector() string {
	s := informer.NodeField(c.NodeName)
	if c.FieldSelector != "" {
		s += "," + c.FieldSelector
	}
	return s
}

// selectsAllPodsOf reports whether the controller watches exactly node's pods, all
// of them: node is its NodeName, and no REPAIR_LABEL_SELECTORS or
// REPAIR_FIELD_SELECTORS narrow the watch. Only then may it read the informer of the
// node's pods that the agent shares (informer.NewNodePods).
func (c Config) selectsAllPodsOf(node string) bool {
	return node == c.NodeName && c.LabelSelector == "" && c.FieldSelector == ""
}
