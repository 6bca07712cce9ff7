package agent

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"testing"
)

// podReadsPolicy is a kube-apiserver audit policy that records, once per request
// (when it is received), every list and watch of pods by user, and nothing else.
const podReadsPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["ResponseStarted", "ResponseComplete", "Panic"]
rules:
- level: Metadata
  users: [%q]
  verbs: ["list", "watch"]
  resources: [{group: "", resources: ["pods"]}]
- level: None
`

// auditPodReads makes the API server count user's pod lists and watches: it
// returns the flags that enable the audit log, and a function that reads the log so
// far as "verb fieldSelector" -> requests, and "relist fieldSelector" -> the requests
// among them that read every pod from the start (a list, or a watch that streams
// the list first).
func auditPodReads(t *testing.T, user string) (apiServerArgs []string, read func() map[string]int) {
	t.Helper()
	dir := t.TempDir() // removed after the control plane, which is started later, has stopped
	policy, log := filepath.Join(dir, "policy.yaml"), filepath.Join(dir, "audit.log")
	writeFile(t, policy, fmt.Appendf(nil, podReadsPolicy, user), 0o644)
	return []string{"--audit-policy-file=" + policy, "--audit-log-path=" + log, "--audit-log-mode=blocking", "--audit-log-format=json"},
		func() map[string]int {
			t.Helper()
			f, err := os.Open(log)
			if err != nil {
				t.Fatalf("audit log: %v", err)
			}
			defer f.Close()
			got := map[string]int{}
			sc := bufio.NewScanner(f)
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				var ev struct {
					Verb, RequestURI string
				}
				if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
					t.Fatalf("audit log line %q: %v", sc.Text(), err)
				}
				u, err := url.Parse(ev.RequestURI)
				if err != nil {
					t.Fatalf("audit log: request URI %q: %v", ev.RequestURI, err)
				}
				q := u.Query()
				got[ev.Verb+" "+q.Get("fieldSelector")]++
				if ev.Verb == "list" || q.Get("sendInitialEvents") == "true" {
					// Every pod, from the start: a list, or a watch that streams
					// the list first (client-go's WatchListClient).
					got["relist "+q.Get("fieldSelector")]++
				}
			}
			if err := sc.Err(); err != nil {
				t.Fatalf("audit log: %v", err)
			}
			return got
		}
}
