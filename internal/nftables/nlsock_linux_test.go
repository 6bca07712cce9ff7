package nftables

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
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

// TestABatchIsAnsweredWithAcksAlone: the library flags each rule it adds for an
// echo it then throws away; the socket clears the flag, so the kernel answers a
// batch with one ack per message and builds no copy of any rule, and the rules
// are there all the same.
func TestABatchIsAnsweredWithAcksAlone(t *testing.T) {
	ns := testNS(t)
	in(t, ns, func() error {
		s, err := openBlockingSocket()
		if err != nil {
			return err
		}
		defer s.close()
		var acks, others int
		c, err := gnft.New(gnft.AsLasting(), gnft.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
			got, err := s.exchange(req)
			for _, m := range got {
				if m.Header.Type == netlink.Error {
					acks++
				} else {
					others++
				}
			}
			return got, err
		}))
		if err != nil {
			return err
		}
		defer c.CloseLasting()
		tb := c.AddTable(&gnft.Table{Family: gnft.TableFamilyIPv4, Name: "echo-test"})
		ch := c.AddChain(&gnft.Chain{Table: tb, Name: "c"})
		const rules = 3
		for range rules {
			c.AddRule(&gnft.Rule{Table: tb, Chain: ch, Exprs: []expr.Any{&expr.Counter{}}})
		}
		if err := c.Flush(); err != nil {
			return err
		}
		if others != 0 || acks != 2+rules {
			t.Errorf("the batch was answered with %d acks and %d other messages, want %d acks alone", acks, others, 2+rules)
		}
		got, err := c.GetRules(tb, ch)
		if err != nil {
			return err
		}
		if len(got) != rules {
			t.Errorf("read back %d rules, want %d", len(got), rules)
		}
		return nil
	})
}
