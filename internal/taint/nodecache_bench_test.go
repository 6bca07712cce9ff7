package taint

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/istio-cni/istio-cni/internal/informer"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
)

// BenchmarkLeadersNodeCache measures what the taint leader's cache of Nodes holds
// per Node, with the transform it runs with (informer.TrimNode) and without it:
// the live heap of an informer of 500 Nodes as a cloud's kubelet registers them
// (labels, annotations, capacity, five conditions, addresses, 30 images), after a
// collection, against a real API server. The leader caches every Node of the
// cluster; the scale simulation's leader row (README, "Cluster scale") is its
// whole process's RSS, which also holds what decoding the list left.
func BenchmarkLeadersNodeCache(b *testing.B) {
	const nodes = 500
	cp := controlplane.StartForTest(b, controlplane.Options{})
	ctx := b.Context()
	api := cp.AdminClient().CoreV1().Nodes()
	for i := range nodes {
		if _, err := api.Create(ctx, cloudNode(i), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name      string
		transform cache.TransformFunc
	}{{"untrimmed", nil}, {"trimmed", informer.TrimNode}} {
		b.Run(tc.name, func(b *testing.B) {
			var perNode float64
			for range b.N {
				before := liveHeap()
				inf := informer.New(&corev1.Node{}, informer.Selector{}, api.List, api.Watch)
				if tc.transform != nil {
					_ = inf.SetTransform(tc.transform)
				}
				runCtx, stop := context.WithCancel(ctx)
				go inf.RunWithContext(runCtx)
				syncCtx, cancel := context.WithTimeout(ctx, time.Minute)
				synced := cache.WaitForCacheSync(syncCtx.Done(), inf.HasSynced)
				cancel()
				if !synced {
					b.Fatal("the informer did not sync within a minute")
				}
				if n := len(inf.GetStore().List()); n != nodes {
					b.Fatalf("%d Nodes cached, want %d", n, nodes)
				}
				perNode = float64(liveHeap()-before) / nodes / 1024
				runtime.KeepAlive(inf)
				stop()
			}
			b.ReportMetric(perNode, "KiB/node")
		})
	}
}

// liveHeap is the heap in use after two collections.
func liveHeap() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// cloudNode is Node i as a cloud's kubelet and node controllers fill it in.
func cloudNode(i int) *corev1.Node {
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	rl := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("16"), corev1.ResourceMemory: resource.MustParse("64Gi"),
		corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceEphemeralStorage: resource.MustParse("100Gi")}
	var conds []corev1.NodeCondition
	for _, c := range []corev1.NodeConditionType{corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure, corev1.NodeNetworkUnavailable, corev1.NodeReady} {
		conds = append(conds, corev1.NodeCondition{Type: c, Status: corev1.ConditionFalse, LastHeartbeatTime: now, LastTransitionTime: now,
			Reason: "Kubelet" + string(c), Message: "kubelet reports " + string(c)})
	}
	var images []corev1.ContainerImage
	for k := range 30 {
		images = append(images, corev1.ContainerImage{Names: []string{
			fmt.Sprintf("registry.example/team-%02d/service@sha256:%064x", k, k*7919+i),
			fmt.Sprintf("registry.example/team-%02d/service:v1.%d.0", k, k)}, SizeBytes: int64(50_000_000 + k*1_000_000)})
	}
	name := fmt.Sprintf("node-%04d", i)
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels: map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
				"node.kubernetes.io/instance-type": "m6i.4xlarge", "topology.kubernetes.io/zone": fmt.Sprintf("eu-west-1%c", 'a'+rune(i%3))},
			Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true",
				"csi.volume.kubernetes.io/nodeid": fmt.Sprintf(`{"ebs.csi.aws.com":"i-%017x"}`, i)}},
		Spec: corev1.NodeSpec{PodCIDR: fmt.Sprintf("10.%d.%d.0/24", 64+i/256, i%256), ProviderID: fmt.Sprintf("aws:///eu-west-1a/i-%017x", i),
			Taints: []corev1.Taint{{Key: "cni.istio.io/not-ready", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{Capacity: rl, Allocatable: rl, Conditions: conds, Images: images,
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.0.%d.%d", i/256, i%256)}, {Type: corev1.NodeHostName, Address: name}},
			NodeInfo: corev1.NodeSystemInfo{MachineID: fmt.Sprintf("%032x", i), SystemUUID: fmt.Sprintf("%032x", i*7), BootID: fmt.Sprintf("%032x", i*13),
				KernelVersion: "6.1.0-27-cloud-amd64", OSImage: "Debian GNU/Linux 12 (bookworm)", ContainerRuntimeVersion: "containerd://2.4.2",
				KubeletVersion: "v1.37.2", OperatingSystem: "linux", Architecture: "amd64"}},
	}
}
