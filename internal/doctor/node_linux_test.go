package doctor

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/repair"
)

// anotherPodsNetns is a finder on a node where the address asked for is held by a
// live namespace: another pod's, when the pod asked about has ended.
type anotherPodsNetns struct{ asked int }

func (f *anotherPodsNetns) Find(context.Context, []netip.Addr) (*repair.Netns, error) {
	f.asked++
	return &repair.Netns{Path: "/proc/1/ns/net", Source: "/proc/4242/ns/net (another pod's)"}, nil
}

// TestFindNetnsRefusesAPodThatHasEnded: a pod that ended (a completed Job's, an
// evicted one) keeps its address in its status, but its sandbox is gone and the
// address may be another pod's by now. inspect and probe found that pod's network
// namespace by the address and reported its rules as the ended pod's. They now say
// that the pod has ended, and search for nothing; a running pod is searched for
// as before.
func TestFindNetnsRefusesAPodThatHasEnded(t *testing.T) {
	for _, tc := range []struct {
		phase   string
		wantErr bool
	}{
		{"Succeeded", true},
		{"Failed", true},
		{"Running", false},
		{"Pending", false},
	} {
		t.Run(tc.phase, func(t *testing.T) {
			f := &anotherPodsNetns{}
			n := &Node{Name: thisNode, Finder: f}
			pod := &kube.Pod{
				Metadata: kube.ObjectMeta{Name: "job-1", Namespace: testNS},
				Spec:     kube.PodSpec{NodeName: thisNode},
				Status:   kube.PodStatus{Phase: tc.phase, PodIP: "10.251.7.10"},
			}
			_, err := n.FindNetns(t.Context(), pod)
			if !tc.wantErr {
				if err != nil || f.asked != 1 {
					t.Errorf("FindNetns = %v after %d searches, want the namespace holding its address", err, f.asked)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "has ended (phase "+tc.phase+")") {
				t.Errorf("FindNetns = %v, want an error saying the pod has ended", err)
			}
			if f.asked != 0 {
				t.Errorf("the node was searched %d times for the address of a pod that has ended", f.asked)
			}
		})
	}
}

// sandboxFinder finds a namespace whose pause process is in the cgroup of pod uid.
type sandboxFinder struct{ uid string }

func (f sandboxFinder) Find(context.Context, []netip.Addr) (*repair.Netns, error) {
	return &repair.Netns{Path: "/proc/1/ns/net", Source: "/proc/4242/ns/net", Proc: "/proc/4242", PodUID: f.uid}, nil
}

// TestFindNetnsRefusesAnotherPodsSandbox: a running pod whose sandbox just died
// keeps its address in its status until the kubelet reports the next one, while
// the network plugin may have given the address to a pod started since. inspect
// and probe showed that pod's rules as this one's. A namespace whose pause
// process the kubelet's cgroups place in another pod is now refused, as repair
// in place refuses it (repair.Netns.CheckSandboxOf); the pod's own, or one
// nothing says is another pod's, is found as before.
func TestFindNetnsRefusesAnotherPodsSandbox(t *testing.T) {
	const uid = "0f3c2b1a-9d8e-4f70-a6b5-c4d3e2f1a0b9"
	pod := &kube.Pod{
		Metadata: kube.ObjectMeta{Name: "web", Namespace: testNS, UID: uid},
		Spec:     kube.PodSpec{NodeName: thisNode},
		Status:   kube.PodStatus{Phase: "Running", PodIP: "10.251.7.10"},
	}
	for _, tc := range []struct {
		nsPod   string
		refused bool
	}{
		{uid, false},
		{"", false},
		{"1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d", true},
	} {
		n := &Node{Name: thisNode, Finder: sandboxFinder{tc.nsPod}}
		_, err := n.FindNetns(t.Context(), pod)
		if refused := err != nil; refused != tc.refused {
			t.Errorf("namespace of pod uid %q: FindNetns = %v, want refused %v", tc.nsPod, err, tc.refused)
		}
		if tc.refused && !errors.Is(err, repair.ErrAnotherPodsNetns) {
			t.Errorf("FindNetns = %v, want repair.ErrAnotherPodsNetns", err)
		}
	}
}
