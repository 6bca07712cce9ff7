//go:build !unitonly

package plugin

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/internal/applylock"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/test/harness/root"
)

// TestAnADDWaitsForTheApplyInItsNamespaceAndNamesIt: while the agent's repair
// in place applies into a pod's network namespace (it holds the namespace's
// apply lock, an flock of the namespace itself, which it opens through /proc,
// as the test does here, where the plugin opens the runtime's path), the pod's
// ADD, with either backend, waits for it rather than write beside it. An ADD
// whose bound runs out first fails, its error naming the namespace and the
// process that holds the lock (here the test's own); once the repair is done,
// the ADD goes through.
func TestAnADDWaitsForTheApplyInItsNamespaceAndNamesIt(t *testing.T) {
	root.Require(t)
	for _, backend := range []string{"iptables", "nftables"} {
		t.Run(backend, func(t *testing.T) {
			n := newCheckNode(t, backend, injectedPod())
			id, err := netns.ID(n.ns)
			if err != nil {
				t.Fatal(err)
			}
			var release func()
			if err := netns.Do(n.ns, func() (err error) {
				release, err = applylock.Take(context.Background())
				return err
			}); err != nil {
				t.Fatal(err)
			}
			p := n.plugin()
			p.Timeout = 500 * time.Millisecond
			err = p.Add(n.args())
			release()
			if err == nil {
				t.Fatal("the ADD went through while the repair held the namespace's apply lock")
			}
			t.Logf("the ADD's error: %v", err)
			for _, want := range []string{
				fmt.Sprintf("network namespace net:[%d]: gave up after ", id),
				"(the caller's bound) waiting for its apply lock, ",
				fmt.Sprintf("held by pid %d (plugin.test): ", os.Getpid()),
			} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the ADD's error:\n%v\nwant it to say %q", err, want)
				}
			}
			if err := n.plugin().Add(n.args()); err != nil {
				t.Fatalf("the ADD once the repair let go: %v\n%s", err, n.stderr.String())
			}
		})
	}
}
