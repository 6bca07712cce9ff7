package chart

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/istio-cni/istio-cni/test/scale"
)

// TestTheScaleSimulationRunsAgentsAsTheChartDoes: test/scale runs its agents with
// grants and an environment written out by hand (it has no Helm); with the values
// it names (the defaults and taint.enabled=true), they must be what the chart
// renders. Rights are compared one (group, resource, name, verb) at a time over
// every Role and ClusterRole bound to the agent's ServiceAccount; each variable of
// the simulation must have the rendered DaemonSet's value, but for those it lists
// as set otherwise, with a reason.
func TestTheScaleSimulationRunsAgentsAsTheChartDoes(t *testing.T) {
	m := mustRender(t, "--set", "taint.enabled=true")
	ds := m.daemonSet(t)
	sa := ds.Spec.Template.Spec.ServiceAccountName

	got := map[string]bool{}
	add := func(rules []rbacv1.PolicyRule) {
		for _, k := range grantKeys(rules) {
			got[k] = true
		}
	}
	bound := func(subjects []rbacv1.Subject) bool {
		return slices.ContainsFunc(subjects, func(s rbacv1.Subject) bool {
			return s.Kind == rbacv1.ServiceAccountKind && s.Name == sa && s.Namespace == ds.Namespace
		})
	}
	for _, d := range m.all("ClusterRoleBinding") {
		b := d.object.(*rbacv1.ClusterRoleBinding)
		if bound(b.Subjects) {
			add(object[*rbacv1.ClusterRole](t, m, "ClusterRole", b.RoleRef.Name).Rules)
		}
	}
	for _, d := range m.all("RoleBinding") {
		b := d.object.(*rbacv1.RoleBinding)
		if !bound(b.Subjects) {
			continue
		}
		if b.RoleRef.Kind == "ClusterRole" {
			add(object[*rbacv1.ClusterRole](t, m, "ClusterRole", b.RoleRef.Name).Rules)
		} else {
			add(object[*rbacv1.Role](t, m, "Role", b.RoleRef.Name).Rules)
		}
	}
	var want, have []string
	want = grantKeys(scale.AgentRules)
	for k := range got {
		have = append(have, k)
	}
	slices.Sort(want)
	want = slices.Compact(want)
	slices.Sort(have)
	if diff := cmp.Diff(have, want); diff != "" {
		t.Errorf("test/scale's AgentRules differ from the chart's grants to %s (-chart +AgentRules):\n%s", sa, diff)
	}

	env := podEnv(t, m, "istio-cni-node-x7k2p", "worker-1")
	for _, kv := range scale.AgentEnv {
		k, v, _ := strings.Cut(kv, "=")
		if why, ok := scale.AgentEnvNotTheCharts[k]; ok {
			if env[k] == v {
				t.Errorf("%s=%s is listed as not the chart's (%s), but the chart renders it so", k, v, why)
			}
			continue
		}
		if rendered, ok := env[k]; !ok || rendered != v {
			t.Errorf("test/scale's agents run with %s=%s; the chart renders %q (set: %v)", k, v, rendered, ok)
		}
	}
}

// grantKeys spells every right of rules as group/resource/name/verb, "*" for
// any name.
func grantKeys(rules []rbacv1.PolicyRule) []string {
	var keys []string
	for _, r := range rules {
		names := r.ResourceNames
		if len(names) == 0 {
			names = []string{"*"}
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, n := range names {
					for _, v := range r.Verbs {
						keys = append(keys, g+"/"+res+"/"+n+"/"+v)
					}
				}
			}
		}
	}
	return keys
}
