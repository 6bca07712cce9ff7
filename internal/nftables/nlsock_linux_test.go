package nftables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/redirect"
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

// largePlan is a valid plan under the README's limits whose netlink batch is far
// larger than a socket's default send buffer (208 KiB): 256 outbound CIDRs, 256
// excluded CIDRs and 256 excluded interfaces, in both families.
func largePlan(t testing.TB) *redirect.Plan {
	t.Helper()
	s := sidecarSpec()
	s.IPv6 = true
	s.OutboundCIDRs = redirect.PrefixSet{}
	for i := range 256 {
		s.OutboundCIDRs.Prefixes = append(s.OutboundCIDRs.Prefixes, netip.MustParsePrefix(fmt.Sprintf("10.%d.0.0/16", i)))
		s.OutboundCIDRsExclude = append(s.OutboundCIDRsExclude, netip.MustParsePrefix(fmt.Sprintf("172.16.%d.0/24", i)))
		s.ExcludeInterfaces = append(s.ExcludeInterfaces, fmt.Sprintf("veth%d", i))
	}
	p, err := redirect.Build(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestLargeBatchOverNetlinkWithoutNft: a plan whose batch exceeds the socket's
// default send buffer is applied over netlink alone (no nft binary to fall back
// to), and reads back equal to the plan.
func TestLargeBatchOverNetlinkWithoutNft(t *testing.T) {
	ns := testNS(t)
	plan := largePlan(t)
	t.Setenv("PATH", t.TempDir()) // no nft: the netlink-only setup
	var diffs []string
	in(t, ns, func() error {
		b := NewBackend()
		if _, err := b.Apply(context.Background(), plan); err != nil {
			if n := len(err.Error()); n > 4096 {
				t.Errorf("the error is %d bytes long", n)
			}
			return fmt.Errorf("apply a large plan over netlink: %.2000s", err)
		}
		var err error
		diffs, err = b.Verify(context.Background(), plan)
		return err
	})
	if len(diffs) > 0 {
		t.Fatalf("after apply, %d differences, first: %q", len(diffs), diffs[0])
	}
}

// TestSmallBatchLeavesSendBufferAlone: a pod's usual batch is sent as it is, the
// socket's buffer neither read nor raised (no system call spent on it).
func TestSmallBatchLeavesSendBufferAlone(t *testing.T) {
	ns := testNS(t)
	rs, err := translate(caseNamed(t, "everything").plan(t), testGroups)
	if err != nil {
		t.Fatal(err)
	}
	in(t, ns, func() error {
		c, err := dialHere()
		if err != nil {
			return err
		}
		defer c.Close()
		before, err := unix.GetsockoptInt(c.sock.fd, unix.SOL_SOCKET, unix.SO_SNDBUF)
		if err != nil {
			return err
		}
		if err := flushRuleset(c, rs, nil); err != nil {
			return err
		}
		after, err := unix.GetsockoptInt(c.sock.fd, unix.SOL_SOCKET, unix.SO_SNDBUF)
		if err != nil {
			return err
		}
		if c.sock.fitted || after != before {
			t.Errorf("a small batch sized the send buffer (fitted %v, %d -> %d bytes)", c.sock.fitted, before, after)
		}
		return nil
	})
}

// TestRepeatedErrorsAreCollapsed: a batch whose send failed fails each of its
// messages' acks alike, and the library joins them; the error keeps one line per
// distinct error, with its count, and still matches the errno.
func TestRepeatedErrorsAreCollapsed(t *testing.T) {
	// Joined one at a time, as the library's Flush does.
	joined := errors.New("first")
	for range 1500 {
		joined = errors.Join(joined, fmt.Errorf("netlink receive: %w", os.NewSyscallError("sendmsg", unix.EMSGSIZE)))
	}
	err := collapseRepeats(fmt.Errorf("netlink transaction: %w", fmt.Errorf("conn.Receive: %w", joined)))
	want := "netlink transaction: conn.Receive: first\nnetlink receive: sendmsg: message too long (1500 times)"
	if err.Error() != want {
		t.Errorf("collapsed error:\n%s\nwant:\n%s", err, want)
	}
	if !errors.Is(err, unix.EMSGSIZE) {
		t.Error("the collapsed error no longer matches EMSGSIZE")
	}
	plain := errors.New("one")
	if collapseRepeats(plain) != plain {
		t.Error("an error without repeats was rewritten")
	}
}

// TestBatchOverASmallSendBufferIsResent: on a node whose default send buffer is
// smaller than a batch the socket sends without sizing it, the kernel's refusal
// (EMSGSIZE) makes the socket raise the buffer and send the batch again.
func TestBatchOverASmallSendBufferIsResent(t *testing.T) {
	ns := testNS(t)
	rs, err := translate(caseNamed(t, "everything").plan(t), testGroups)
	if err != nil {
		t.Fatal(err)
	}
	in(t, ns, func() error {
		c, err := dialHere()
		if err != nil {
			return err
		}
		defer c.Close()
		// This socket only: the kernel doubles it to 8 KiB, below the batch.
		if err := unix.SetsockoptInt(c.sock.fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4096); err != nil {
			return err
		}
		if err := flushRuleset(c, rs, nil); err != nil {
			return fmt.Errorf("a batch over an 8 KiB send buffer: %w", err)
		}
		if !c.sock.fitted {
			t.Error("the batch went out without the buffer being sized")
		}
		return nil
	})
}
