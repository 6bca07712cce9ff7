package scale

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/istio-cni/istio-cni/test/harness/pods"
)

// PodsPerNode is the kubelet's default maximum (--max-pods): every simulated node
// is full, as the busiest nodes of a large cluster are.
const PodsPerNode = 110

// clusterSize is the simulated cluster: Pods workload pods, PodsPerNode on each
// node (the last node holds the rest), PodsPerNamespace in each namespace.
type clusterSize struct {
	Pods, PodsPerNamespace int
}

func (s clusterSize) nodes() int      { return (s.Pods + PodsPerNode - 1) / PodsPerNode }
func (s clusterSize) namespaces() int { return (s.Pods + s.PodsPerNamespace - 1) / s.PodsPerNamespace }

func nodeName(i int) string      { return fmt.Sprintf("node-%04d", i) }
func namespaceName(i int) string { return fmt.Sprintf("team-%03d", i) }

// workloadPod is pod number i (0-based) of the cluster: on node i/PodsPerNode, in
// namespace i/PodsPerNamespace, shaped as Istio's injector shapes a Deployment's
// pod (the sidecar, its volumes and environment make a pod several KiB, as in a
// real mesh). gen makes the names of replacement pods unique.
func workloadPod(s clusterSize, i, gen int) *corev1.Pod {
	ns := namespaceName(i / s.PodsPerNamespace)
	app := fmt.Sprintf("svc-%d", (i/10)%1000)
	name := fmt.Sprintf("%s-7d9f8c6b5-%05d-%d", app, i, gen)
	p := pods.Injected(ns, name, nodeName(i/PodsPerNode))
	p.Labels = map[string]string{
		"app": app, "version": "v1", "pod-template-hash": "7d9f8c6b5",
		"security.istio.io/tlsMode": "istio", "service.istio.io/canonical-name": app,
		"service.istio.io/canonical-revision": "v1",
	}
	p.Annotations["sidecar.istio.io/status"] = `{"initContainers":["istio-validation"],"containers":["istio-proxy"],` +
		`"volumes":["workload-socket","credential-socket","workload-certs","istio-envoy","istio-data","istio-podinfo","istio-token","istiod-ca-cert"],` +
		`"imagePullSecrets":null,"revision":"default"}`
	p.Annotations["istio.io/rev"] = "default"
	p.Annotations["kubectl.kubernetes.io/default-container"] = "app"
	p.Annotations["prometheus.io/path"] = "/stats/prometheus"
	p.Annotations["prometheus.io/port"] = "15020"
	p.Annotations["prometheus.io/scrape"] = "true"
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: app + "-7d9f8c6b5",
		UID: types.UID(fmt.Sprintf("00000000-0000-0000-0000-%012d", (i/10)%1000)), Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
	res := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("1Gi")},
	}
	env := []corev1.EnvVar{{Name: "PILOT_CERT_PROVIDER", Value: "istiod"}, {Name: "CA_ADDR", Value: "istiod.istio-system.svc:15012"},
		{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
		{Name: "INSTANCE_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		{Name: "SERVICE_ACCOUNT", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.serviceAccountName"}}},
		{Name: "HOST_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}},
		{Name: "ISTIO_CPU_LIMIT", Value: "2"}, {Name: "PROXY_CONFIG", Value: "{}\n"},
		{Name: "ISTIO_META_POD_PORTS", Value: `[{"containerPort":8080,"protocol":"TCP"}]`},
		{Name: "ISTIO_META_APP_CONTAINERS", Value: "app"}, {Name: "GOMEMLIMIT", Value: "1073741824"}, {Name: "GOMAXPROCS", Value: "2"},
		{Name: "ISTIO_META_CLUSTER_ID", Value: "Kubernetes"}, {Name: "ISTIO_META_NODE_NAME", Value: p.Spec.NodeName},
		{Name: "ISTIO_META_INTERCEPTION_MODE", Value: "REDIRECT"}, {Name: "ISTIO_META_WORKLOAD_NAME", Value: app},
		{Name: "ISTIO_META_OWNER", Value: "kubernetes://apis/apps/v1/namespaces/" + ns + "/deployments/" + app},
		{Name: "ISTIO_META_MESH_ID", Value: "cluster.local"}, {Name: "TRUST_DOMAIN", Value: "cluster.local"}}
	mounts := []corev1.VolumeMount{{Name: "workload-socket", MountPath: "/var/run/secrets/workload-spiffe-uds"},
		{Name: "credential-socket", MountPath: "/var/run/secrets/credential-uds"}, {Name: "workload-certs", MountPath: "/var/run/secrets/workload-spiffe-credentials"},
		{Name: "istiod-ca-cert", MountPath: "/var/run/secrets/istio"}, {Name: "istio-data", MountPath: "/var/lib/istio/data"},
		{Name: "istio-envoy", MountPath: "/etc/istio/proxy"}, {Name: "istio-token", MountPath: "/var/run/secrets/tokens"},
		{Name: "istio-podinfo", MountPath: "/etc/istio/pod"}, {Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}}
	proxy := &p.Spec.Containers[1]
	proxy.Env, proxy.VolumeMounts, proxy.Resources = env, mounts, res
	proxy.Ports = []corev1.ContainerPort{{Name: "http-envoy-prom", ContainerPort: 15090, Protocol: corev1.ProtocolTCP}}
	proxy.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz/ready", Port: intstr.FromInt32(15021)}},
		InitialDelaySeconds: 1, PeriodSeconds: 2, FailureThreshold: 4}
	proxy.SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To[int64](1337), RunAsGroup: ptr.To[int64](1337), RunAsNonRoot: ptr.To(true),
		ReadOnlyRootFilesystem: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
	init := &p.Spec.InitContainers[0]
	init.Resources = res
	init.Args = append(init.Args, "-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020")
	app0 := &p.Spec.Containers[0]
	app0.Ports = []corev1.ContainerPort{{ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}
	app0.Resources = res
	app0.VolumeMounts = mounts[len(mounts)-1:]
	p.Spec.Volumes = []corev1.Volume{
		{Name: "workload-socket", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "credential-socket", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "workload-certs", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "istio-envoy", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
		{Name: "istio-data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "istio-podinfo", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
			{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
			{Path: "annotations", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations"}}}}}},
		{Name: "istio-token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "istio-ca", ExpirationSeconds: ptr.To[int64](43200), Path: "istio-token"}}}}}},
		{Name: "istiod-ca-cert", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "istio-ca-root-cert"}}}},
		{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{ExpirationSeconds: ptr.To[int64](3607), Path: "token"}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}}}}}},
	}
	return p
}

// runningStatus is what a kubelet reports for a started pod: Running, Ready, the
// validation container exited 0 (or 126 when broken: the pod started without
// its redirection, which the repair controller acts on).
func runningStatus(p *corev1.Pod, podIP string, broken bool) corev1.PodStatus {
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	cond := func(t corev1.PodConditionType) corev1.PodCondition {
		return corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now}
	}
	validation := corev1.ContainerStatus{Name: "istio-validation", Image: "docker.io/istio/proxyv2:1.28.0",
		ImageID:     "docker.io/istio/proxyv2@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		ContainerID: "containerd://" + fmt.Sprintf("%064x", len(p.Name)*7919),
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now,
			ContainerID: "containerd://" + fmt.Sprintf("%064x", len(p.Name)*7919)}}, Ready: true}
	if broken {
		validation.State.Terminated.ExitCode, validation.State.Terminated.Reason = 126, "Error"
		validation.Ready = false
	}
	running := func(name, image string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, Image: image, ImageID: image + "@sha256:fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210",
			ContainerID: "containerd://" + fmt.Sprintf("%064x", len(name)*104729), Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}
	}
	return corev1.PodStatus{
		Phase: corev1.PodRunning,
		Conditions: []corev1.PodCondition{cond("PodReadyToStartContainers"), cond(corev1.PodInitialized), cond(corev1.PodReady),
			cond(corev1.ContainersReady), cond(corev1.PodScheduled)},
		HostIP: "10.0.0.1", HostIPs: []corev1.HostIP{{IP: "10.0.0.1"}}, PodIP: podIP, PodIPs: []corev1.PodIP{{IP: podIP}},
		StartTime: &now, QOSClass: corev1.PodQOSBurstable,
		InitContainerStatuses: []corev1.ContainerStatus{validation},
		ContainerStatuses:     []corev1.ContainerStatus{running("app", "registry.example/app:1"), running("istio-proxy", "docker.io/istio/proxyv2:1.28.0")},
	}
}

func podIP(i int) string { return fmt.Sprintf("10.%d.%d.%d", 64+i/65536%64, i/256%256, i%256) }

// simNode is a Node as a cloud's kubelet registers it: labels, capacity, five
// conditions, addresses and the images it holds (the bulk of a real Node object).
func simNode(name string, i int) *corev1.Node {
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	rl := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("16"), corev1.ResourceMemory: resource.MustParse("64Gi"),
		corev1.ResourcePods: resource.MustParse(fmt.Sprint(PodsPerNode)), corev1.ResourceEphemeralStorage: resource.MustParse("100Gi")}
	var conds []corev1.NodeCondition
	for _, c := range []corev1.NodeConditionType{corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure, corev1.NodeNetworkUnavailable} {
		conds = append(conds, corev1.NodeCondition{Type: c, Status: corev1.ConditionFalse, LastHeartbeatTime: now, LastTransitionTime: now, Reason: "KubeletHasSufficient" + string(c), Message: "kubelet has sufficient resources"})
	}
	conds = append(conds, corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: now, LastTransitionTime: now, Reason: "KubeletReady", Message: "kubelet is posting ready status"})
	var images []corev1.ContainerImage
	for k := range 30 {
		images = append(images, corev1.ContainerImage{Names: []string{
			fmt.Sprintf("registry.example/team-%02d/service@sha256:%064x", k, k*31337),
			fmt.Sprintf("registry.example/team-%02d/service:v1.%d.0", k, k)}, SizeBytes: int64(50_000_000 + k*1_000_000)})
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
			"node.kubernetes.io/instance-type": "m6i.4xlarge", "topology.kubernetes.io/region": "eu-west-1",
			"topology.kubernetes.io/zone": fmt.Sprintf("eu-west-1%c", 'a'+rune(i%3)), "node-role.kubernetes.io/worker": "",
		}},
		Spec: corev1.NodeSpec{PodCIDR: fmt.Sprintf("10.%d.%d.0/24", 64+i/256, i%256), ProviderID: "aws:///eu-west-1a/i-" + fmt.Sprintf("%017x", i)},
		Status: corev1.NodeStatus{
			Capacity: rl, Allocatable: rl, Conditions: conds,
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.0.%d.%d", i/256, i%256)}, {Type: corev1.NodeHostName, Address: name}},
			NodeInfo: corev1.NodeSystemInfo{MachineID: fmt.Sprintf("%032x", i), SystemUUID: fmt.Sprintf("%032x", i*7), BootID: fmt.Sprintf("%032x", i*13),
				KernelVersion: "6.1.0-27-cloud-amd64", OSImage: "Debian GNU/Linux 12 (bookworm)", ContainerRuntimeVersion: "containerd://2.4.2",
				KubeletVersion: "v1.37.2", OperatingSystem: "linux", Architecture: "amd64"},
			Images: images,
		},
	}
}

// agentPod is the DaemonSet's pod on node, Ready: the taint controller reads these.
func agentPod(node string, ds *appsv1.DaemonSet) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: daemonSetName + "-" + node, Namespace: agentNamespace,
			Labels: map[string]string{agentLabelKey: agentLabel},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "istio-cni", HostNetwork: true,
			Containers: []corev1.Container{{Name: "install-cni", Image: "install-cni"}}},
	}
}

func readyStatus() corev1.PodStatus {
	return corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
}

// parallel runs f(0..n-1) on workers goroutines; the first error stops the rest.
func parallel(ctx context.Context, n, workers int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}

// retry calls f until it succeeds, fails for good, or 5 attempts with a growing
// pause (at most 15 s in all) have failed with an error an overloaded API server
// or etcd gives (timeouts, 429, 5xx): on a busy shared machine etcd does time out.
func retry(ctx context.Context, f func() error) error {
	pause := 500 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := f()
		if err == nil || attempt == 5 || !transient(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
		pause *= 2
	}
}

func transient(err error) bool {
	return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || strings.Contains(err.Error(), "timed out")
}

// createPod creates p and reports it started (status as a kubelet sets it).
func createPod(ctx context.Context, c kubernetes.Interface, p *corev1.Pod, ip string, broken bool) error {
	pods := c.CoreV1().Pods(p.Namespace)
	var created *corev1.Pod
	err := retry(ctx, func() (err error) {
		created, err = pods.Create(ctx, p, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) { // an attempt that timed out went through
			created, err = pods.Get(ctx, p.Name, metav1.GetOptions{})
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("create pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	created.Status = runningStatus(created, ip, broken)
	err = retry(ctx, func() error {
		_, err := pods.UpdateStatus(ctx, created, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("set status of pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}

// populate creates the cluster of size s: the namespaces, the nodes, the agents'
// DaemonSet with a Ready agent pod on every node, and the workload pods.
func populate(ctx context.Context, c kubernetes.Interface, s clusterSize, workers int) error {
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNamespace}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", agentNamespace, err)
	}
	if _, err := c.CoreV1().ServiceAccounts(agentNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "istio-cni"}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the agents' ServiceAccount: %w", err)
	}
	err := parallel(ctx, s.namespaces(), workers, func(ctx context.Context, i int) error {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespaceName(i), Labels: map[string]string{"istio-injection": "enabled"}}}
		if _, err := c.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create namespace %s: %w", ns.Name, err)
		}
		// The ServiceAccount admission plugin wants "default" before it admits pods.
		_, err := c.CoreV1().ServiceAccounts(ns.Name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return err
	}
	labels := map[string]string{agentLabelKey: agentLabel}
	ds, err := c.AppsV1().DaemonSets(agentNamespace).Create(ctx, &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: daemonSetName, Namespace: agentNamespace, Labels: labels},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "install-cni", Image: "install-cni"}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create DaemonSet: %w", err)
	}
	err = parallel(ctx, s.nodes(), workers, func(ctx context.Context, i int) error {
		name := nodeName(i)
		n, err := c.CoreV1().Nodes().Create(ctx, simNode(name, i), metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create node %s: %w", name, err)
		}
		n.Status = simNode(name, i).Status
		if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("set status of node %s: %w", name, err)
		}
		p, err := c.CoreV1().Pods(agentNamespace).Create(ctx, agentPod(name, ds), metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create agent pod on %s: %w", name, err)
		}
		p.Status = readyStatus()
		_, err = c.CoreV1().Pods(agentNamespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return err
	}
	return parallel(ctx, s.Pods, workers, func(ctx context.Context, i int) error {
		return createPod(ctx, c, workloadPod(s, i, 0), podIP(i), false)
	})
}
