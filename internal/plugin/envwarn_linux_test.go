//go:build !unitonly

package plugin

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/test/harness/root"
)

// addThenCheckLog runs an ADD and then a CHECK of pod (nftables) with the
// plugin's log in a file of its own, and returns the file.
func addThenCheckLog(t *testing.T, pod *kube.Pod) []byte {
	t.Helper()
	n := newCheckNode(t, "nftables", pod)
	logFile := filepath.Join(t.TempDir(), "istio-cni.log")
	n.conf = []byte(strings.Replace(string(n.conf), `"log_file":""`, fmt.Sprintf(`"log_file":%q`, logFile), 1))
	if err := n.plugin().Add(n.args()); err != nil {
		t.Fatalf("ADD: %v\n%s", err, n.stderr.String())
	}
	if err := n.plugin().Check(n.args()); err != nil {
		t.Fatalf("CHECK: %v\n%s", err, n.stderr.String())
	}
	data, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestASidecarVariableThatIsNotABooleanIsWarnedOfOncePerADD: an ADD of a pod
// whose istio-proxy sets ISTIO_META_DNS_CAPTURE=yes and ISTIO_DUAL_STACK="on "
// (neither a boolean as Istio reads them) sets up the capture as if both were
// false, as the proxy runs, and its log holds one warning for each, naming the
// container, the variable and the value; a variable that is a boolean
// (INVALID_DROP=true) is not warned of, and a CHECK after it warns of nothing.
func TestASidecarVariableThatIsNotABooleanIsWarnedOfOncePerADD(t *testing.T) {
	root.Require(t)
	pod := injectedPod(withProxyEnv(EnvDNSCapture, "yes"), withProxyEnv(EnvDualStack, "on "), withProxyEnv(EnvInvalidDrop, "true"))
	data := addThenCheckLog(t, pod)
	type warning struct{ Pod, Container, Variable, Value string }
	var got []warning
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var rec struct {
			Level, Msg string
			warning
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Level == "WARN" && strings.Contains(rec.Msg, "not a boolean") {
			got = append(got, rec.warning)
		}
	}
	want := []warning{
		{"default/web-1", ContainerIstioProxy, EnvDNSCapture, "yes"},
		{"default/web-1", ContainerIstioProxy, EnvDualStack, "on "},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("warnings of the ADD and the CHECK (-want +got):\n%s\nthe log file holds:\n%s", diff, data)
	}
}

// TestAContainerRunningAsTheProxysIDIsWarnedOfOncePerADD: an ADD of a pod whose
// app container runs as the proxy's uid by its own security context (1337,
// beside istio-proxy's default) sets up the capture, as Istio's plugin does, and
// its log holds one warning naming the container, the uid and where it comes
// from; a CHECK after it warns of nothing.
func TestAContainerRunningAsTheProxysIDIsWarnedOfOncePerADD(t *testing.T) {
	root.Require(t)
	pod := injectedPod(withContainerSecurity("app", int64p(1337), int64p(1000)))
	data := addThenCheckLog(t, pod)
	type warning struct {
		Msg, Pod, Container, From string
		UID                       uint32
	}
	var got []warning
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var rec struct {
			Level string
			warning
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Level == "WARN" && strings.Contains(rec.Msg, "proxy's uid or gid") {
			got = append(got, rec.warning)
		}
	}
	want := []warning{{"ADD: " + SharedProxyIDWarning, "default/web-1", "app", "container", 1337}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("warnings of the ADD and the CHECK (-want +got):\n%s\nthe log file holds:\n%s", diff, data)
	}
}
