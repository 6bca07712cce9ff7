package nftables

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestDumpOverManyDatagramsIsReadWhole reads back a chain far larger than one
// netlink datagram: the kernel cuts the rule dump into many, and every rule must
// arrive, in order, through the blocking socket.
func TestDumpOverManyDatagramsIsReadWhole(t *testing.T) {
	ns := testNS(t)
	plan := caseNamed(t, "default-sidecar").plan(t)
	in(t, ns, func() error {
		_, err := NewBackend().Apply(context.Background(), plan)
		return err
	})
	before := 0
	for _, tb := range readNS(t, ns) {
		if c := tb.chain("ISTIO_OUTPUT"); tb.id.name == "istio-proxy-nat" && c != nil {
			before = len(c.rules)
		}
	}
	if before == 0 {
		t.Fatal("no ISTIO_OUTPUT rules after apply")
	}
	// 3,000 rules of about 100 bytes each: some 300 KB, ten datagrams or more.
	const extra = 3000
	var script strings.Builder
	for i := range extra {
		fmt.Fprintf(&script, "add rule ip istio-proxy-nat ISTIO_OUTPUT tcp dport %d return\n", 1+i)
	}
	command(t, ns, script.String(), "nft", "-f", "-")
	var got []string
	for _, tb := range readNS(t, ns) {
		if c := tb.chain("ISTIO_OUTPUT"); tb.id.name == "istio-proxy-nat" && c != nil {
			for _, r := range c.rules[before:] {
				got = append(got, r.text)
			}
		}
	}
	if len(got) != extra {
		t.Fatalf("read %d added rules, want %d", len(got), extra)
	}
	for i, text := range got {
		if want := fmt.Sprintf("tcp dport %d return", 1+i); text != want {
			t.Fatalf("added rule %d reads %q, want %q", i, text, want)
		}
	}
}

// TestNetlinkWaitIsBounded: a receive with no answer coming fails after the
// socket's bound, naming it, instead of blocking the ADD.
func TestNetlinkWaitIsBounded(t *testing.T) {
	ns := testNS(t)
	in(t, ns, func() error {
		s, err := openBlockingSocketBounded(200 * time.Millisecond)
		if err != nil {
			return err
		}
		defer s.close()
		start := time.Now()
		_, err = s.receive()
		took := time.Since(start)
		if err == nil || !strings.Contains(err.Error(), "no answer from the kernel within 200ms") {
			t.Errorf("receive with nothing sent: %v, want the bound named", err)
		}
		if took < 200*time.Millisecond || took > 2*time.Second {
			t.Errorf("receive returned after %v, want about the 200ms bound", took)
		}
		return nil
	})
}
