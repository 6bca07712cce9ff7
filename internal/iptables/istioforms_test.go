package iptables

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// istioTProxySave is what iptables-save shows in a namespace Istio's istio-iptables
// programmed in TPROXY mode with an excluded interface (eth9), plus rules of someone
// else's in the same built-in chains that look almost like Istio's.
const istioTProxySave = `*mangle
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:ISTIO_DIVERT - [0:0]
:ISTIO_INBOUND - [0:0]
:ISTIO_TPROXY - [0:0]
-A PREROUTING -i eth9 -j RETURN
-A PREROUTING -p tcp -j ISTIO_INBOUND
-A PREROUTING -p tcp -m mark --mark 0x539 -j CONNMARK --save-mark --nfmask 0xffffffff --ctmask 0xffffffff
-A PREROUTING -p udp -m mark --mark 0x539 -j CONNMARK --save-mark --nfmask 0xffffffff --ctmask 0xffffffff
-A PREROUTING -i eth0 -p tcp -j RETURN
-A OUTPUT -o eth9 -j RETURN
-A OUTPUT -o lo -p tcp -m mark --mark 0x539 -j RETURN
-A OUTPUT ! -d 127.0.0.1/32 -o lo -p tcp -m owner --uid-owner 1337 -j MARK --set-xmark 0x53a/0xffffffff
-A OUTPUT ! -d 127.0.0.1/32 -o lo -p tcp -m owner --gid-owner 1337 -j MARK --set-xmark 0x53a/0xffffffff
-A OUTPUT -p tcp -m connmark --mark 0x539 -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
-A OUTPUT -o lo -j MARK --set-xmark 0x53a/0xffffffff
-A OUTPUT ! -d 10.0.0.0/8 -o lo -p tcp -m owner --uid-owner 1337 -j MARK --set-xmark 0x53a/0xffffffff
-A OUTPUT -o lo -p tcp -m mark --mark 0x539 -j ACCEPT
-A ISTIO_DIVERT -j MARK --set-xmark 0x539/0xffffffff
-A ISTIO_DIVERT -j ACCEPT
-A ISTIO_INBOUND -p tcp -m mark --mark 0x539 -j RETURN
-A ISTIO_INBOUND -p tcp -j ISTIO_TPROXY
-A ISTIO_TPROXY ! -d 127.0.0.1/32 -p tcp -j TPROXY --on-port 15006 --on-ip 0.0.0.0 --tproxy-mark 0x539/0xffffffff
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:ISTIO_INBOUND - [0:0]
:ISTIO_OUTPUT - [0:0]
-A PREROUTING -i eth9 -j RETURN
-A PREROUTING -p tcp -j ISTIO_INBOUND
-A PREROUTING -i eth0 -j ACCEPT
-A OUTPUT -o eth9 -j RETURN
-A OUTPUT -j ISTIO_OUTPUT
-A OUTPUT -p tcp -m tcp --dport 9999 -j RETURN
-A OUTPUT ! -o eth9 -j RETURN
-A ISTIO_INBOUND -p tcp -m tcp --dport 15008 -j RETURN
-A ISTIO_OUTPUT -j RETURN
COMMIT
*filter
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -i eth9 -j RETURN
-A OUTPUT -o eth9 -j RETURN
COMMIT
`

// TestCleanupRemovesIstiosBuiltinChainRulesOnly: removing everything of ours from a
// namespace Istio programmed deletes, besides our chains and the jumps into them, the
// rules Istio writes straight into built-in chains, and no rule of anyone else's,
// however alike.
func TestCleanupRemovesIstiosBuiltinChainRulesOnly(t *testing.T) {
	d, err := ParseSave(istioTProxySave)
	if err != nil {
		t.Fatal(err)
	}
	var deleted []string
	for _, l := range strings.Split(restoreText(nil, ours(d)), "\n") {
		if strings.HasPrefix(l, "*") || strings.HasPrefix(l, "-D ") {
			deleted = append(deleted, l)
		}
	}
	want := []string{
		"*mangle",
		"-D PREROUTING -p tcp -j ISTIO_INBOUND",
		"-D PREROUTING -i eth9 -j RETURN",
		"-D PREROUTING -p tcp -m mark --mark 0x539 -j CONNMARK --save-mark --nfmask 0xffffffff --ctmask 0xffffffff",
		"-D OUTPUT -o eth9 -j RETURN",
		"-D OUTPUT -o lo -p tcp -m mark --mark 0x539 -j RETURN",
		"-D OUTPUT ! -d 127.0.0.1/32 -o lo -p tcp -m owner --uid-owner 1337 -j MARK --set-xmark 0x53a/0xffffffff",
		"-D OUTPUT ! -d 127.0.0.1/32 -o lo -p tcp -m owner --gid-owner 1337 -j MARK --set-xmark 0x53a/0xffffffff",
		"-D OUTPUT -p tcp -m connmark --mark 0x539 -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff",
		"*nat",
		"-D PREROUTING -p tcp -j ISTIO_INBOUND",
		"-D OUTPUT -j ISTIO_OUTPUT",
		"-D PREROUTING -i eth9 -j RETURN",
		"-D OUTPUT -o eth9 -j RETURN",
	}
	if diff := cmp.Diff(want, deleted); diff != "" {
		t.Errorf("deleted lines (-want +got):\n%s", diff)
	}
}

// TestIstiosBuiltinFormsNeedChainsOfOurs: without a chain of ours in the family,
// Istio never programmed it, so an "-i eth9 -j RETURN" is someone else's.
func TestIstiosBuiltinFormsNeedChainsOfOurs(t *testing.T) {
	d, err := ParseSave("*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A PREROUTING -i eth9 -j RETURN\n-A OUTPUT -o eth9 -j RETURN\nCOMMIT\n" +
		"*mangle\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -p tcp -m mark --mark 0x539 -j CONNMARK --save-mark --nfmask 0xffffffff --ctmask 0xffffffff\nCOMMIT\n")
	if err != nil {
		t.Fatal(err)
	}
	if live := ours(d); len(live) != 0 {
		t.Errorf("found rules of ours in a namespace without chains of ours: %+v", live)
	}
}

// TestIstiosBuiltinFormsCountInATableWithoutChainsOfOurs: Istio in TPROXY mode
// without inbound ports writes mangle rules but no mangle chain; its nat chains
// show that it programmed the family.
func TestIstiosBuiltinFormsCountInATableWithoutChainsOfOurs(t *testing.T) {
	d, err := ParseSave("*nat\n:OUTPUT ACCEPT [0:0]\n:ISTIO_OUTPUT - [0:0]\n-A OUTPUT -j ISTIO_OUTPUT\nCOMMIT\n" +
		"*mangle\n:OUTPUT ACCEPT [0:0]\n-A OUTPUT -p tcp -m connmark --mark 0x539 -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff\nCOMMIT\n")
	if err != nil {
		t.Fatal(err)
	}
	text := restoreText(nil, ours(d))
	if !strings.Contains(text, "*mangle\n-D OUTPUT -p tcp -m connmark --mark 0x539 -j CONNMARK --restore-mark") {
		t.Errorf("the mangle rule is not removed:\n%s", text)
	}
}
