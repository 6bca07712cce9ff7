package istioiptables

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/internal/regularfile"
)

// TestRemovalTakesTProxyRoutingWithoutInboundPorts: the apply adds TPROXY's routing
// only with inbound ports, but --cleanup-only in TPROXY mode removes it whatever
// ports it is given, since an earlier apply may have added it.
func TestRemovalTakesTProxyRoutingWithoutInboundPorts(t *testing.T) {
	cases := []struct {
		name string
		set  func(s *redirect.Spec)
		want *redirect.Routing
	}{
		{"REDIRECT: no routing", func(s *redirect.Spec) {}, nil},
		{"TPROXY with inbound ports: the plan's routing", func(s *redirect.Spec) {
			s.Mode, s.InboundPorts, s.TProxyMark = redirect.ModeTProxy, redirect.PortSet{All: true}, 7
		}, &redirect.Routing{Mark: 7, Table: redirect.DefaultTProxyRouteTable}},
		{"TPROXY without inbound ports: the routing an apply with ports added", func(s *redirect.Spec) {
			s.Mode, s.TProxyRouteTable = redirect.ModeTProxy, 200
		}, &redirect.Routing{Mark: redirect.DefaultTProxyMark, Table: 200}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := redirect.DefaultSpec()
			tc.set(&spec)
			plan, err := redirect.Build(spec)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, removalPlan(spec, plan).Routing); diff != "" {
				t.Errorf("removal routing (-want +got):\n%s", diff)
			}
		})
	}
}

// TestResolvConfThatIsANamedPipeIsRefusedAtOnce: with --redirect-dns, a
// --resolv-conf that is a FIFO is refused naming it, not waited on until some
// process writes to it (istio-iptables has no other bound on the read).
func TestResolvConfThatIsANamedPipeIsRefusedAtOnce(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "resolv.conf")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Capture.DNS.Enabled = true
	cfg.Capture.ProxyUIDs = []uint32{1337}
	cfg.ResolvConf = fifo
	errc := make(chan error, 1)
	go func() { _, err := completeSpec(slog.Default(), cfg); errc <- err }()
	select {
	case err := <-errc:
		if !errors.Is(err, regularfile.ErrNotRegular) || !strings.Contains(err.Error(), fifo) {
			t.Errorf("resolv.conf a named pipe: %v, want an error naming it as not a regular file", err)
		}
	case <-time.After(5 * time.Second):
		// A writer ends the blocked read, so the test's goroutine returns.
		if w, err := os.OpenFile(fifo, os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
			w.Close()
		}
		t.Fatal("istio-iptables still waits to read a named pipe as its resolv.conf")
	}
}
