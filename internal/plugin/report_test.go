package plugin

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/istio-cni/istio-cni/internal/cnicmd"
	"github.com/istio-cni/istio-cni/internal/pluginlog"
)

// TestAFailedADDReportsTheReasonItLogs: the outcome an ADD that failed sends the
// agent (behind istio_cni_plugin_add_failures_total{reason}) names the step its
// "ADD failed" record names, for failures at different steps of the ADD.
func TestAFailedADDReportsTheReasonItLogs(t *testing.T) {
	for _, tc := range []struct {
		name       string
		pod        string
		prevResult string // "" for a standalone ADD
		podFile    bool   // the agent's file of the pod is written
		want       string
	}{
		{name: "previous result, a pod looked up", pod: "app/web", prevResult: `{"cniVersion":"1.1.0","ips":[{"address":"10.1.0.5"}]}`, want: pluginlog.ReasonPrevResult},
		{name: "previous result, a pod passed through", pod: "kube-system/coredns", prevResult: `{"cniVersion":"1.0.0","ips":[{"address":"10.1.0.5"}]}`, want: pluginlog.ReasonPrevResult},
		{name: "the namespace gone", pod: "default/web-1", podFile: true, want: pluginlog.ReasonNetnsGone},
		{name: "the pod not found", pod: "app/missing", prevResult: `{"cniVersion":"1.1.0","ips":[{"address":"10.1.0.5/24"}]}`, want: pluginlog.ReasonPodLookup},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			logFile := filepath.Join(dir, "istio-cni.log")
			events := listenForEvents(t, filepath.Join(dir, "agent.sock"))
			if tc.podFile {
				writeAgentPodFile(t, dir, injectedPod())
			}
			prev := ""
			if tc.prevResult != "" {
				prev = `,"prevResult":` + tc.prevResult
			}
			// A kubeconfig that names no file: a pod the agent's file does not hold
			// fails its lookup at once.
			conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"istio-cni","type":"istio-cni","cni_agent_run_dir":%q,"log_file":%q,"log_socket":%q,`+
				`"exclude_namespaces":["kube-system"],"pod_lookup":{"retries":5,"interval":"1s"}%s}`, dir, logFile, filepath.Join(dir, "agent.sock"), prev)
			ns, name, _ := strings.Cut(tc.pod, "/")
			p := &Plugin{Stdout: io.Discard, Stderr: io.Discard, Timeout: time.Minute}
			if err := p.Add(&cnicmd.CmdArgs{ContainerID: "c1", Netns: filepath.Join(dir, "netns-gone"), IfName: "eth0",
				Args: "K8S_POD_NAMESPACE=" + ns + ";K8S_POD_NAME=" + name + ";K8S_POD_UID=uid-1", StdinData: []byte(conf)}); err == nil {
				t.Fatal("ADD succeeded, want it to fail")
			}
			data, err := os.ReadFile(logFile)
			if err != nil {
				t.Fatal(err)
			}
			var logged []string
			for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
				var rec struct{ Msg, Pod, Reason string }
				if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "ADD failed" && rec.Pod == tc.pod {
					logged = append(logged, rec.Reason)
				}
			}
			if want := []string{tc.want}; !cmp.Equal(logged, want) {
				t.Errorf("reasons of the \"ADD failed\" records = %q, want %q; the log file holds:\n%s", logged, want, data)
			}
			got := <-events
			want := []pluginlog.Event{{Command: "ADD", Outcome: pluginlog.OutcomeFailed, Reason: tc.want}}
			if diff := cmp.Diff(want, got, cmpIgnoreSeconds); diff != "" {
				t.Errorf("events reported to the agent (-want +got):\n%s", diff)
			}
		})
	}
}

var cmpIgnoreSeconds = cmp.Transformer("noSeconds", func(e pluginlog.Event) pluginlog.Event { e.Seconds = 0; return e })

// listenForEvents listens on the agent's log socket at path (SOCK_SEQPACKET, as
// the agent does) and sends, once the plugin has closed its connection, the
// events it sent (log records left out).
func listenForEvents(t *testing.T, path string) <-chan []pluginlog.Event {
	t.Helper()
	l, err := net.Listen("unixpacket", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	out := make(chan []pluginlog.Event, 1)
	go func() {
		var events []pluginlog.Event
		defer func() { out <- events }()
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(time.Minute))
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if err != nil || n == 0 {
				return
			}
			if e, ok := pluginlog.ParseEvent(buf[:n]); ok {
				events = append(events, e)
			}
		}
	}()
	return out
}
