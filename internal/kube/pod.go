package kube

import (
	"fmt"
	"net/netip"
	"time"
)

// Pod is the part of a core/v1 Pod that the CNI plugin reads, decoded straight from
// the API server's JSON. Fields it does not declare are ignored, so newer API servers
// and extra fields never break decoding. Field names and JSON keys follow core/v1.
type Pod struct {
	Metadata ObjectMeta `json:"metadata"`
	Spec     PodSpec    `json:"spec"`
	Status   PodStatus  `json:"status"`
}

// ObjectMeta is the pod's identity and metadata.
type ObjectMeta struct {
	Name              string            `json:"name"`
	Namespace         string            `json:"namespace"`
	UID               string            `json:"uid,omitempty"`
	Labels            map[string]string `json:"labels,omitempty"`
	Annotations       map[string]string `json:"annotations,omitempty"`
	DeletionTimestamp *time.Time        `json:"deletionTimestamp,omitempty"`
}

// MirrorAnnotation is the annotation the kubelet sets on a static pod's mirror, the
// copy of the pod it creates in the API server: the static pod's own uid. The API
// server gives the mirror a uid of its own, while the runtime knows the pod by the
// kubelet's (its sandbox's K8S_POD_UID).
const MirrorAnnotation = "kubernetes.io/config.mirror"

// HasSandboxUID reports whether an API server's pod, with uid and annotations, is
// the pod the kubelet runs as sandboxUID: by its own uid, or, for a static pod's
// mirror, by the static pod's. The plugin's lookups and the agent's pod cache both
// decide it here.
func HasSandboxUID(uid string, annotations map[string]string, sandboxUID string) bool {
	return uid == sandboxUID || (sandboxUID != "" && annotations[MirrorAnnotation] == sandboxUID)
}

// PodSpec holds the containers and the pod-level security context.
type PodSpec struct {
	NodeName        string              `json:"nodeName,omitempty"`
	InitContainers  []Container         `json:"initContainers,omitempty"`
	Containers      []Container         `json:"containers,omitempty"`
	SecurityContext *PodSecurityContext `json:"securityContext,omitempty"`
}

// Container is one container or init container.
type Container struct {
	Name            string           `json:"name"`
	Image           string           `json:"image,omitempty"`
	Args            []string         `json:"args,omitempty"`
	Env             []EnvVar         `json:"env,omitempty"`
	Ports           []ContainerPort  `json:"ports,omitempty"`
	SecurityContext *SecurityContext `json:"securityContext,omitempty"`
	// RestartPolicy is only set on init containers; "Always" makes one a native
	// sidecar (Kubernetes 1.28+), which keeps running beside the app containers.
	RestartPolicy string `json:"restartPolicy,omitempty"`
}

// EnvVar is a literal environment variable. Variables set through valueFrom decode
// with an empty Value, which is what Istio reads for them too.
type EnvVar struct {
	Name  string `json:"name"`
	Value string `json:"value,omitempty"`
}

// ContainerPort is a port a container declares.
type ContainerPort struct {
	Name          string `json:"name,omitempty"`
	ContainerPort int32  `json:"containerPort"`
	Protocol      string `json:"protocol,omitempty"`
}

// SecurityContext is the identity part of a container's security context.
type SecurityContext struct {
	RunAsUser  *int64 `json:"runAsUser,omitempty"`
	RunAsGroup *int64 `json:"runAsGroup,omitempty"`
}

// PodSecurityContext is the identity part of the pod's security context; containers
// inherit it unless they set their own.
type PodSecurityContext struct {
	RunAsUser  *int64 `json:"runAsUser,omitempty"`
	RunAsGroup *int64 `json:"runAsGroup,omitempty"`
}

// PodStatus is the observed state the plugin may use.
type PodStatus struct {
	Phase  string  `json:"phase,omitempty"`
	PodIP  string  `json:"podIP,omitempty"`
	PodIPs []PodIP `json:"podIPs,omitempty"`
}

// PodIP is one of the pod's addresses.
type PodIP struct {
	IP string `json:"ip"`
}

// RestartPolicyAlways marks an init container as a native sidecar.
const RestartPolicyAlways = "Always"

// DecodePod decodes a Pod from the API server's JSON. It requires the metadata that
// every pod has (name and namespace), so an error body or an unrelated object is not
// mistaken for a pod.
func DecodePod(data []byte) (*Pod, error) {
	var p Pod
	if err := decodePod(data, &p); err != nil {
		return nil, fmt.Errorf("decode pod: %w", err)
	}
	if p.Metadata.Name == "" || p.Metadata.Namespace == "" {
		return nil, fmt.Errorf("decode pod: metadata.name and metadata.namespace are required")
	}
	return &p, nil
}

// Key is "namespace/name", the form used in logs and error messages.
func (p *Pod) Key() string { return p.Metadata.Namespace + "/" + p.Metadata.Name }

// AllContainers returns the init containers followed by the containers, the order in
// which Istio's plugin inspects them. Kubernetes requires names to be unique across
// both lists, so a name identifies one container.
func (p *Pod) AllContainers() []Container {
	all := make([]Container, 0, len(p.Spec.InitContainers)+len(p.Spec.Containers))
	all = append(all, p.Spec.InitContainers...)
	return append(all, p.Spec.Containers...)
}

// Container returns the container or init container called name.
func (p *Pod) Container(name string) (c Container, isInit bool, ok bool) {
	for _, c := range p.Spec.InitContainers {
		if c.Name == name {
			return c, true, true
		}
	}
	for _, c := range p.Spec.Containers {
		if c.Name == name {
			return c, false, true
		}
	}
	return Container{}, false, false
}

// Ended reports whether the pod has ended (phase Succeeded or Failed): its
// containers never run again and its sandbox is gone, while its status keeps the
// addresses it had, which may be another pod's by now.
func (p *Pod) Ended() bool { return p.Status.Phase == PodSucceeded || p.Status.Phase == PodFailed }

// The phases of a pod that has ended.
const (
	PodSucceeded = "Succeeded"
	PodFailed    = "Failed"
)

// IPs returns the pod's addresses from its status, podIPs first (in order) and the
// legacy podIP when podIPs is empty. Unparseable entries are dropped.
func (p *Pod) IPs() []netip.Addr {
	var out []netip.Addr
	add := func(s string) {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, a.Unmap())
		}
	}
	for _, ip := range p.Status.PodIPs {
		add(ip.IP)
	}
	if len(out) == 0 && p.Status.PodIP != "" {
		add(p.Status.PodIP)
	}
	return out
}

// Getenv returns the value of the environment variable name. When a name repeats, the
// last entry wins, as it does for the container's process.
func (c Container) Getenv(name string) (value string, ok bool) {
	for _, e := range c.Env {
		if e.Name == name {
			value, ok = e.Value, true
		}
	}
	return value, ok
}

// IsNativeSidecar reports whether c, as an init container, keeps running beside the
// app containers (restartPolicy: Always).
func (c Container) IsNativeSidecar() bool { return c.RestartPolicy == RestartPolicyAlways }

// RunAs returns the user and group c runs as by its own security context, falling
// back to the pod's as Kubernetes does. A nil result means neither sets it (the
// image's USER applies).
func (c Container) RunAs(pod *PodSecurityContext) (uid, gid *int64) {
	if c.SecurityContext != nil {
		uid, gid = c.SecurityContext.RunAsUser, c.SecurityContext.RunAsGroup
	}
	if pod != nil {
		if uid == nil {
			uid = pod.RunAsUser
		}
		if gid == nil {
			gid = pod.RunAsGroup
		}
	}
	return uid, gid
}
