package repair

import (
	"testing"

	"github.com/istio-cni/istio-cni/internal/kube"
)

func TestPodUIDFromCgroupReadsTheKubeletsPodCgroup(t *testing.T) {
	const uid = "0f3c2b1a-9d8e-4f70-a6b5-c4d3e2f1a0b9"
	const static = "6d1c0f0e9a8b7c6d5e4f3a2b1c0d9e8f"
	for _, tc := range []struct {
		name, cgroup, want string
	}{
		{"cgroupfs v1", "12:pids:/kubepods/besteffort/pod" + uid + "/4f2a\n11:memory:/kubepods/besteffort/pod" + uid + "/4f2a\n", uid},
		{"cgroupfs v1 guaranteed", "4:memory:/kubepods/pod" + uid + "/4f2a\n", uid},
		{"systemd v2", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f3c2b1a_9d8e_4f70_a6b5_c4d3e2f1a0b9.slice/cri-containerd-4f2a.scope\n", uid},
		{"systemd v2 guaranteed", "0::/kubepods.slice/kubepods-pod0f3c2b1a_9d8e_4f70_a6b5_c4d3e2f1a0b9.slice/crio-4f2a.scope\n", uid},
		{"relative to the reader's cgroup namespace", "0::/../../kubepods-besteffort-pod0f3c2b1a_9d8e_4f70_a6b5_c4d3e2f1a0b9.slice/cri-containerd-4f2a.scope\n", uid},
		{"static pod", "0::/kubepods/burstable/pod" + static + "/4f2a\n", static},
		{"no pod cgroups (cgroupsPerQOS=false)", "0::/k8s.io/4f2a\n9:name=systemd:/\n", ""},
		{"the host's", "0::/init.scope\n", ""},
		{"not a uid", "0::/kubepods/besteffort/podcast/4f2a\n0::/kubepods/pod" + uid[:35] + "/x\n", ""},
		{"upper case is not the kubelet's", "0::/kubepods/besteffort/pod" + "0F3C2B1A-9D8E-4F70-A6B5-C4D3E2F1A0B9" + "/4f2a\n", ""},
		{"two pods: unknown", "12:pids:/kubepods/pod" + uid + "/a\n11:memory:/kubepods/pod" + static + "/a\n", ""},
		{"empty", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PodUIDFromCgroup([]byte(tc.cgroup)); got != tc.want {
				t.Errorf("PodUIDFromCgroup(%q) = %q, want %q", tc.cgroup, got, tc.want)
			}
		})
	}
}

func TestCheckSandboxOfRefusesOnlyANamespaceKnownToBeAnotherPods(t *testing.T) {
	const uid = "0f3c2b1a-9d8e-4f70-a6b5-c4d3e2f1a0b9"
	const other = "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"
	const static = "6d1c0f0e9a8b7c6d5e4f3a2b1c0d9e8f"
	pod := &kube.Pod{Metadata: kube.ObjectMeta{Name: "web", Namespace: "app", UID: uid}}
	mirror := &kube.Pod{Metadata: kube.ObjectMeta{Name: "etcd-node", Namespace: "kube-system", UID: other,
		Annotations: map[string]string{kube.MirrorAnnotation: static}}}
	for _, tc := range []struct {
		name    string
		pod     *kube.Pod
		nsPod   string
		refused bool
	}{
		{"the pod's", pod, uid, false},
		{"unknown", pod, "", false},
		{"another pod's", pod, other, true},
		{"a static pod's, by its mirror", mirror, static, false},
		{"another static pod's", mirror, "7d1c0f0e9a8b7c6d5e4f3a2b1c0d9e8f", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &Netns{Source: "/proc/42/ns/net", Proc: "/proc/42", PodUID: tc.nsPod}
			err := n.CheckSandboxOf(tc.pod)
			if refused := err != nil; refused != tc.refused {
				t.Fatalf("CheckSandboxOf = %v, want refused %v", err, tc.refused)
			}
		})
	}
}
