package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestCompareListsEveryChangeAndNotesWhatIsNotTheRuns(t *testing.T) {
	base := func() *record {
		return &record{
			Paths:     map[string]string{"/etc": "d", "/etc/hosts": "f", "/run/x": "d", "/tmp/gone": "f"},
			Sysctls:   map[string]string{"net/ipv4/ip_forward": "0", "vm/panic_on_oom": "0"},
			Mounts:    []string{"/"},
			Links:     []string{"eth0", "lo"},
			Netfilter: []string{"nft table ip filter"},
			Processes: []string{"etcd"},
			Modules:   []string{"nf_tables"},
		}
	}
	for _, tc := range []struct {
		name         string
		change       func(after *record)
		diffs, notes []string
	}{
		{"nothing changed", func(*record) {}, nil, nil},
		{"paths", func(a *record) {
			a.Paths["/var/lib/kubelet"] = "d"
			a.Paths["/run/x"] = "f"
			delete(a.Paths, "/etc/hosts")
			delete(a.Paths, "/tmp/gone") // something else cleaning /tmp is not the run's doing
		}, []string{
			"path changed type: /run/x (d -> f)",
			"path appeared: /var/lib/kubelet (d)",
			"path removed: /etc/hosts (f)",
		}, nil},
		{"settings and objects", func(a *record) {
			a.Sysctls["net/ipv4/ip_forward"] = "1"
			delete(a.Sysctls, "vm/panic_on_oom") // unreadable now: not compared
			a.Sysctls["net/netfilter/nf_conntrack_max"] = "65536"
			a.Mounts = append(a.Mounts, "/var/lib/n/netns/x")
			a.Links = []string{"eth0", "lo", "veth1"}
			a.Netfilter = nil
		}, []string{
			`sysctl net.ipv4.ip_forward: "0" -> "1"`,
			"mount appeared: /var/lib/n/netns/x",
			"link appeared: veth1",
			"netfilter gone: nft table ip filter",
		}, nil},
		{"processes and modules", func(a *record) {
			a.Processes = []string{"kubelet"}
			a.Modules = []string{"nf_tables", "xt_TPROXY"}
		}, []string{"process appeared: kubelet"}, []string{
			"process gone: etcd",
			"kernel modules loaded during the run: xt_TPROXY",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			after := base()
			tc.change(after)
			diffs, notes := compare(base(), after)
			if d := cmp.Diff(tc.diffs, diffs); d != "" {
				t.Errorf("differences (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.notes, notes); d != "" {
				t.Errorf("notes (-want +got):\n%s", d)
			}
		})
	}
}

func TestSkippedLeavesOutOnlyWhatIsNotTheRuns(t *testing.T) {
	for _, tc := range []struct {
		path string
		want bool
	}{
		// Made by the run's first iptables command on a machine fresh from boot.
		{"/run/xtables.lock", true},
		{"/var/cache/istio-cni/k8s-v1.37.2", true},
		{"/var/cache/istio-cni", true},
		{"/run/netns", false},
		{"/run/xtables.lock.d", false},
		{"/run/istio-cni/pods", false},
		{"/var/cache/istio-cnix", false},
	} {
		if got := skipped(tc.path); got != tc.want {
			t.Errorf("skipped(%q) = %v, want %v", tc.path, got, tc.want)
		}
	}
}

func TestSetDiffCountsDuplicates(t *testing.T) {
	added, removed := setDiff([]string{"pause", "pause", "etcd"}, []string{"pause", "etcd", "etcd"})
	if d := cmp.Diff([]string{"etcd"}, added); d != "" {
		t.Errorf("added (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"pause"}, removed); d != "" {
		t.Errorf("removed (-want +got):\n%s", d)
	}
}
