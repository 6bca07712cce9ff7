package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/test/harness/testns"
	"github.com/istio-cni/istio-cni/test/harness/wanterr"
)

// execIstio runs the plugin's binary alone for cmd, as libcni runs one plugin of a
// chain: conf is its entry with the list's cniVersion and name (and prevResult),
// the sandbox's identity in the environment (none for STATUS and GC).
func (n *node) execIstio(cmd string, conf map[string]any, sb *sandboxPod) error {
	stdin, err := json.Marshal(conf)
	if err != nil {
		return err
	}
	args := &invoke.Args{Command: cmd, Path: pluginDir}
	if sb != nil {
		rt := n.runtimeConf(sb)
		args.ContainerID, args.NetNS, args.IfName, args.PluginArgs = rt.ContainerID, rt.NetNS, rt.IfName, rt.Args
	}
	return invoke.ExecPluginWithoutResult(context.Background(), filepath.Join(pluginDir, "istio-cni"), stdin, args, &pluginExec{RawExec: &invoke.RawExec{Stderr: n.stderr}})
}

// TestEveryErrorCarriesTheSpecsCode: each way the plugin's binary fails reaches
// the runtime with the CNI spec's (1.1.0) well-known code for it, and a message
// naming the field and the value; each way the spec asks a command to succeed, it
// does. Before: a key of the wrong type and an unsupported setting were "invalid
// network config" (7) like any bad value, an http API root for an https
// kubeconfig was "try again later" (11) though no retry could cure it, STATUS of
// an invalid config was 7 instead of STATUS's "plugin not available" (50), and a
// DEL of a config whose ADD had been refused failed too, stopping the runtime's
// DEL of the chain before the primary plugin released the pod's address.
func TestEveryErrorCarriesTheSpecsCode(t *testing.T) {
	n := newNode(t, shared)
	good := n.newSandbox(createPod(t, shared, meshedPod("codes", "web", nil)))
	badAnnotation := n.newSandbox(createPod(t, shared, meshedPod("codes", "bad", map[string]string{"traffic.sidecar.istio.io/includeInboundPorts": "80,70000"})))
	missing := n.newSandbox(meshedPod("codes", "never-created", nil))
	prev := map[string]any{"cniVersion": "1.1.0", "ips": []any{map[string]any{"address": "10.250.0.5/24"}}}
	for _, tc := range []struct {
		name       string
		cmd        string
		cniVersion string // "" for 1.1.0
		extra      map[string]any
		sb         *sandboxPod
		wantCode   uint // 0: success
		mentions   []string
	}{
		{"ADD, a key of the wrong type: failed to decode (6)", "ADD", "", map[string]any{"native_nftables": "yes"}, good,
			types.ErrDecodingFailure, []string{`"native_nftables"`, "string", "true or false"}},
		{"ADD, ambient mode: unsupported field (2)", "ADD", "", map[string]any{"ambient_enabled": true}, good,
			types.ErrUnsupportedField, []string{`"ambient_enabled"`, "true is not supported"}},
		{"ADD, another intercept type: unsupported field (2)", "ADD", "", map[string]any{"kubernetes": map[string]any{"intercept_type": "ebpf"}}, good,
			types.ErrUnsupportedField, []string{`"kubernetes.intercept_type"`, `"ebpf"`}},
		{"ADD, a bad value: invalid network config (7)", "ADD", "", map[string]any{"plugin_log_level": "loud"}, good,
			types.ErrInvalidNetworkConfig, []string{`"plugin_log_level"`, `"loud"`}},
		{"ADD, an http API root for an https kubeconfig: invalid network config (7), not try again later", "ADD", "",
			map[string]any{"kubernetes": map[string]any{"k8s_api_root": "http://127.0.0.1:1"}}, good,
			types.ErrInvalidNetworkConfig, []string{"kubernetes.k8s_api_root", "http://127.0.0.1:1"}},
		{"ADD, a config of a newer schema: try again later (11)", "ADD", "", map[string]any{"config_schema": 99}, good,
			types.ErrTryAgainLater, []string{`"config_schema" is 99`}},
		{"ADD, a 0.2.0 config: incompatible CNI version (1)", "ADD", "0.2.0", nil, good,
			types.ErrIncompatibleCNIVersion, []string{"incompatible CNI versions", "0.2.0"}},
		{"ADD, an invalid annotation: invalid network config (7)", "ADD", "", nil, badAnnotation,
			types.ErrInvalidNetworkConfig, []string{"codes/bad", "traffic.sidecar.istio.io/includeInboundPorts", `"70000"`}},
		{"ADD, a pod the API server does not have: try again later (11)", "ADD", "", nil, missing,
			types.ErrTryAgainLater, []string{"codes/never-created", "lookup failed after 3 tries", "does not exist"}},
		{"CHECK, a 0.3.1 config: incompatible CNI version (1)", "CHECK", "0.3.1", nil, good,
			types.ErrIncompatibleCNIVersion, []string{"config version does not allow CHECK"}},
		{"DEL, a 0.2.0 config: success, its ADD was refused", "DEL", "0.2.0", nil, good, 0, nil},
		{"DEL, a config of no version (0.1.0): success", "DEL", "-", nil, good, 0, nil},
		{"DEL, an invalid config: success", "DEL", "", map[string]any{"plugin_log_level": "loud"}, good, 0, nil},
		{"STATUS, an invalid config: plugin not available (50)", "STATUS", "", map[string]any{"ambient_enabled": true}, nil,
			types.ErrPluginNotAvailable, []string{`"ambient_enabled"`}},
		{"STATUS, a 1.0.0 config: incompatible CNI version (1)", "STATUS", "1.0.0", nil, nil,
			types.ErrIncompatibleCNIVersion, []string{"config version does not allow STATUS"}},
		{"GC, an invalid config: invalid network config (7)", "GC", "", map[string]any{"plugin_log_level": "loud"}, nil,
			types.ErrInvalidNetworkConfig, []string{`"loud"`}},
		{"GC: success", "GC", "", map[string]any{"cni.dev/valid-attachments": []any{map[string]any{"containerID": good.containerID, "ifname": "eth0"}}}, nil, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conf := n.istioEntry(tc.extra)
			conf["name"] = "k8s-pod-network"
			switch tc.cniVersion {
			case "":
				conf["cniVersion"] = "1.1.0"
			case "-": // none
			default:
				conf["cniVersion"] = tc.cniVersion
			}
			if tc.cmd == "ADD" || tc.cmd == "CHECK" {
				conf["prevResult"] = prev
			}
			err := n.execIstio(tc.cmd, conf, tc.sb)
			if tc.wantCode == 0 {
				if err != nil {
					t.Fatalf("%s: %v, want success", tc.cmd, err)
				}
				return
			}
			var cerr *types.Error
			if !errors.As(err, &cerr) || cerr.Code != tc.wantCode {
				t.Fatalf("%s: %#v, want error code %d", tc.cmd, err, tc.wantCode)
			}
			wanterr.Mentions(t, err, tc.mentions...)
			if tc.sb != nil {
				wantNoRules(t, tc.sb, "a failed "+tc.cmd)
			}
		})
	}
}

// TestCheckOfAGoneNetnsNamesIt: CHECK of a pod whose network namespace is gone
// fails with "invalid environment variables" (4) naming CNI_NETNS, and DEL of it
// still succeeds, twice (the spec's idempotent DEL), with nothing to warn of.
// Gone is removed, or unmounted with its file left (a runtime unmounts the
// namespace before it removes the file); the latter's CHECK failed with 999 ("not
// a network namespace file") and its DEL warned "cleanup incomplete".
func TestCheckOfAGoneNetnsNamesIt(t *testing.T) {
	for _, tc := range []struct {
		name, pod string
		gone      func(path string) error
	}{
		{"removed", "gone", testns.Delete},
		{"unmounted, its file left", "gone-unmounted", func(path string) error { return unix.Unmount(path, unix.MNT_DETACH) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, shared)
			list := n.chain(n.istioEntry(nil))
			sb, res := n.addPod(t, list, createPod(t, shared, meshedPod("codes", tc.pod, nil)))
			if err := tc.gone(sb.netns); err != nil {
				t.Fatal(err)
			}
			conf := n.istioEntry(nil)
			conf["name"], conf["cniVersion"], conf["prevResult"] = "k8s-pod-network", "1.1.0", res
			err := n.execIstio("CHECK", conf, sb)
			var cerr *types.Error
			if !errors.As(err, &cerr) || cerr.Code != types.ErrInvalidEnvironmentVariables || !strings.Contains(cerr.Msg, "CNI_NETNS "+sb.netns) {
				t.Errorf("CHECK of a gone namespace: %v, want code 4 naming CNI_NETNS %s", err, sb.netns)
			}
			for i := range 2 {
				if err := n.execIstio("DEL", conf, sb); err != nil {
					t.Errorf("DEL %d of a gone namespace: %v", i+1, err)
				}
			}
			if log := n.stderr.String(); strings.Contains(log, "cleanup incomplete") {
				t.Errorf("DEL of a gone namespace warned:\n%s", log)
			}
		})
	}
}

// TestADELOfARefusedConfigLetsThePrimaryReleaseTheAddress: in a chain whose config
// the plugin refuses (0.2.0, which an admin may have put it in by hand), the ADD
// fails after the primary plugin (ptp) allocated the pod's address; the runtime's
// DEL runs the chain backwards, this plugin first. Its DEL succeeds, so ptp's DEL
// runs and host-local releases the address. Before, this plugin's DEL failed with
// the same "incompatible CNI versions", the runtime's DEL stopped there, and the
// address leaked while the sandbox could not be deleted.
func TestADELOfARefusedConfigLetsThePrimaryReleaseTheAddress(t *testing.T) {
	n := newNode(t, shared)
	raw := mustJSON(t, map[string]any{"cniVersion": "0.2.0", "name": "k8s-pod-network", "plugins": []any{n.ptpEntry(), n.istioEntry(nil)}})
	list, err := libcni.ConfListFromBytes(raw)
	if err != nil {
		t.Fatal(err)
	}
	sb := n.newSandbox(createPod(t, shared, meshedPod("codes", "refused", nil)))
	_, err = n.addJSON(list, n.runtimeConf(sb))
	var cerr *types.Error
	if !errors.As(err, &cerr) || cerr.Code != types.ErrIncompatibleCNIVersion {
		t.Fatalf("ADD of a 0.2.0 chain: %v, want the plugin's incompatible-version error (1)", err)
	}
	ipam := filepath.Join(n.dir, "ipam", "k8s-pod-network")
	allocated := func() []string {
		entries, _ := os.ReadDir(ipam)
		var ips []string
		for _, e := range entries {
			if _, err := netip.ParseAddr(e.Name()); err == nil {
				ips = append(ips, e.Name())
			}
		}
		return ips
	}
	if len(allocated()) != 1 {
		t.Fatalf("after ptp's ADD host-local holds %v, want one address", allocated())
	}
	for i := range 2 {
		if err := n.del(list, sb); err != nil {
			t.Fatalf("DEL %d of the chain: %v", i+1, err)
		}
	}
	if ips := allocated(); len(ips) != 0 {
		t.Errorf("after the DEL host-local still holds %v: ptp's DEL did not run", ips)
	}
}

// TestADELWithAConfigThatNoLongerValidatesRemovesTheCapture: a pod's DEL whose
// config no longer validates (a value edited since the ADD, or one a stricter
// build refuses) still finds the rules where the config puts them and removes
// them, and succeeds; DEL again succeeds. Before, it succeeded without removing
// anything: the capture stayed in a namespace the runtime need not destroy.
func TestADELWithAConfigThatNoLongerValidatesRemovesTheCapture(t *testing.T) {
	for _, tc := range []struct {
		name    string
		backend map[string]any
	}{
		{"iptables", nil},
		{"nftables", map[string]any{"native_nftables": true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, shared)
			sb, res := n.addPod(t, n.chain(n.istioEntry(tc.backend)), createPod(t, shared, meshedPod("codes", "del-"+tc.name, nil)))
			if out := runIn(t, sb.netns, "iptables-save") + runIn(t, sb.netns, "nft", "list", "ruleset"); !strings.Contains(out, "ISTIO_REDIRECT") {
				t.Fatalf("no capture after the ADD:\n%s", out)
			}
			conf := n.istioEntry(tc.backend)
			conf["name"], conf["cniVersion"], conf["prevResult"] = "k8s-pod-network", "1.1.0", res
			conf["plugin_log_level"] = "loud"
			for i := range 2 {
				if err := n.execIstio("DEL", conf, sb); err != nil {
					t.Fatalf("DEL %d with a config that no longer validates: %v", i+1, err)
				}
				wantNoRules(t, sb, fmt.Sprintf("DEL %d with a config that no longer validates", i+1))
			}
		})
	}
}

// TestCHECKWithoutThePreviousResultIsRefused: the spec has the runtime pass the
// result of the pod's ADD to CHECK (libcni passes the one it cached) and the
// plugin consult it; a CHECK without one is refused as an invalid config (7)
// naming prevResult, as the reference chained plugins refuse it, where it passed.
// With it, the same CHECK passes.
func TestCHECKWithoutThePreviousResultIsRefused(t *testing.T) {
	n := newNode(t, shared)
	sb, res := n.addPod(t, n.chain(n.istioEntry(nil)), createPod(t, shared, meshedPod("codes", "check-prev", nil)))
	conf := n.istioEntry(nil)
	conf["name"], conf["cniVersion"], conf["prevResult"] = "k8s-pod-network", "1.1.0", res
	if err := n.execIstio("CHECK", conf, sb); err != nil {
		t.Fatalf("CHECK with the ADD's result: %v", err)
	}
	for _, prev := range []any{nil, "absent"} {
		if prev == nil {
			conf["prevResult"] = nil
		} else {
			delete(conf, "prevResult")
		}
		err := n.execIstio("CHECK", conf, sb)
		var cerr *types.Error
		if !errors.As(err, &cerr) || cerr.Code != types.ErrInvalidNetworkConfig {
			t.Fatalf("CHECK with prevResult %v: %#v, want code 7", prev, err)
		}
		wanterr.Mentions(t, err, `"prevResult"`, "missing")
	}
}

// TestTheErrorObjectIsTheSpecs: the binary prints a failure as the spec's error
// object, its cniVersion the protocol version in use: the config's when the
// plugin speaks it, else the newest it speaks; an invalid variable is the spec's
// 4 naming it (the plugin's own namespace as CNI_NETNS was the CNI library's 8,
// none of the spec's codes). The CNI library's error type has no cniVersion, so
// the runtime's reading cannot show it: stdout is read here.
func TestTheErrorObjectIsTheSpecs(t *testing.T) {
	n := newNode(t, shared)
	sb := n.newSandbox(createPod(t, shared, meshedPod("codes", "error-object", nil)))
	for _, tc := range []struct {
		name       string
		cmd        string
		cniVersion string
		extra      map[string]any
		noIfName   bool
		netns      string // "": the sandbox's
		want       map[string]any
		msg        string // what msg holds
	}{
		{"ADD, a bad value in a 0.4.0 config", "ADD", "0.4.0", map[string]any{"plugin_log_level": "loud"}, false, "",
			map[string]any{"cniVersion": "0.4.0", "code": float64(types.ErrInvalidNetworkConfig)}, `"loud"`},
		{"CHECK of a 0.3.1 config", "CHECK", "0.3.1", nil, false, "",
			map[string]any{"cniVersion": "0.3.1", "code": float64(types.ErrIncompatibleCNIVersion)}, `"0.3.1"`},
		{"ADD of a 0.2.0 config", "ADD", "0.2.0", nil, false, "",
			map[string]any{"cniVersion": "1.1.0", "code": float64(types.ErrIncompatibleCNIVersion)}, "incompatible CNI versions"},
		{"ADD without CNI_IFNAME", "ADD", "1.0.0", nil, true, "",
			map[string]any{"cniVersion": "1.1.0", "code": float64(types.ErrInvalidEnvironmentVariables)}, "CNI_IFNAME"},
		{"ADD into the plugin's own namespace", "ADD", "1.0.0", nil, false, "/proc/self/ns/net",
			map[string]any{"cniVersion": "1.0.0", "code": float64(types.ErrInvalidEnvironmentVariables)}, `CNI_NETNS "/proc/self/ns/net"`},
		{"CHECK of the plugin's own namespace", "CHECK", "1.0.0", map[string]any{"prevResult": map[string]any{"cniVersion": "1.0.0"}}, false, "/proc/self/ns/net",
			map[string]any{"cniVersion": "1.0.0", "code": float64(types.ErrInvalidEnvironmentVariables)}, `CNI_NETNS "/proc/self/ns/net"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conf := n.istioEntry(tc.extra)
			conf["name"], conf["cniVersion"] = "k8s-pod-network", tc.cniVersion
			cmd := exec.Command(filepath.Join(pluginDir, "istio-cni"))
			netns := sb.netns
			if tc.netns != "" {
				netns = tc.netns
			}
			cmd.Env = []string{"CNI_COMMAND=" + tc.cmd, "CNI_CONTAINERID=" + sb.containerID, "CNI_NETNS=" + netns,
				"CNI_ARGS=K8S_POD_NAMESPACE=codes;K8S_POD_NAME=error-object", "CNI_PATH=" + pluginDir}
			if !tc.noIfName {
				cmd.Env = append(cmd.Env, "CNI_IFNAME=eth0")
			}
			cmd.Stdin = bytes.NewReader(mustJSON(t, conf))
			var stdout bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, n.stderr
			if err := cmd.Run(); err == nil {
				t.Fatalf("%s succeeded, want it to fail", tc.cmd)
			}
			var got map[string]any
			if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
				t.Fatalf("stdout is not JSON: %v\n%s", err, stdout.String())
			}
			for k, want := range tc.want {
				if got[k] != want {
					t.Errorf("%q is %v, want %v: %s", k, got[k], want, stdout.String())
				}
			}
			if msg, _ := got["msg"].(string); !strings.Contains(msg, tc.msg) {
				t.Errorf("msg %q does not say %s", msg, tc.msg)
			}
		})
	}
}
