package iptables

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/specs"
)

// nssChildEnv runs TestRestoresAskNoPasswdServerFromThePodsNamespace's body:
// its value is the directory of the node files the child shows in place of the
// host's, in its own mount namespace.
const nssChildEnv = "IPTABLES_TEST_NSS_CHILD"

// TestRestoresAskNoPasswdServerFromThePodsNamespace: libxt_owner looks up an
// owner match's uid as a user name first (getpwnam("1337"); its gid,
// getgrnam), through NSS. On a node whose passwd or group sources ask a server
// (GKE with OS Login: "files cache_oslogin oslogin"; nis, ldap, hesiod), every
// restore of the pod's rules then asks that server from the pod's half set-up
// network namespace, and the ADD stalls or fails with it (istio/istio#48416).
// Here the node's sources are "files hesiod" and its resolver 127.0.0.1:
// hesiod asks for 1337.passwd and 1337.group by DNS, which a listener on the
// pod namespace's 127.0.0.1:53 receives. The restores must ask nothing. The
// node's files are the child's, in a mount namespace of its own (this test, run
// again under unshare); the host's are never touched.
func TestRestoresAskNoPasswdServerFromThePodsNamespace(t *testing.T) {
	root.Require(t)
	if dir := os.Getenv(nssChildEnv); dir != "" {
		nssChild(t, dir)
		return
	}
	hesiod, _ := filepath.Glob("/usr/lib/*/libnss_hesiod.so.2")
	more, _ := filepath.Glob("/lib*/libnss_hesiod.so.2")
	if len(hesiod)+len(more) == 0 {
		t.Fatal("libnss_hesiod.so.2 is not installed (Debian's libc6 ships it): the test needs a passwd source that asks a server")
	}
	for _, name := range []string{"iptables-legacy-restore", "iptables-nft-restore", "flock"} {
		if _, err := exec.LookPath(name); err != nil {
			t.Fatalf("%s is not installed: %v", name, err)
		}
	}
	mnt, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, text := range map[string]string{
		"nsswitch.conf": "# a node whose user and group lookups go to a server\npasswd:         files hesiod\ngroup:          files hesiod\n",
		"resolv.conf":   "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n",
		"hesiod.conf":   "lhs=.ns\nrhs=.istio-cni.test\n",
		"parent-mnt":    mnt,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"legacy", "legacy before 1.8.6", "nft"} {
		t.Run(mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, self, "-test.run=^TestRestoresAskNoPasswdServerFromThePodsNamespace$", "-test.v")
			cmd.Env = append(os.Environ(), nssChildEnv+"="+dir, "IPTABLES_TEST_NSS_MODE="+mode, "HESIOD_CONFIG="+filepath.Join(dir, "hesiod.conf"))
			// A mount namespace of the child's own, its mounts private (Go makes
			// them so before the exec).
			cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: unix.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
			out, err := cmd.CombinedOutput()
			t.Logf("child:\n%s", out)
			if err != nil {
				t.Fatalf("the child test failed: %v", err)
			}
		})
	}
}

func nssChild(t *testing.T, dir string) {
	parent, err := os.ReadFile(filepath.Join(dir, "parent-mnt"))
	if err != nil {
		t.Fatal(err)
	}
	if mnt, err := os.Readlink("/proc/self/ns/mnt"); err != nil || mnt == string(parent) {
		t.Fatalf("the child shares the test's mount namespace (%s, %v): it must not mount over the host's files", mnt, err)
	}
	for _, name := range []string{"nsswitch.conf", "resolv.conf"} {
		if err := unix.Mount(filepath.Join(dir, name), "/etc/"+name, "", unix.MS_BIND, ""); err != nil {
			t.Fatalf("show the node's %s: %v", name, err)
		}
	}
	if ownerLookupsLocal(nsswitchConf) {
		t.Fatal("the child's nsswitch.conf counts as local")
	}

	stateDir := t.TempDir()
	cfg := Config{Mode: ModeLegacy, LockDir: stateDir}
	var nodeLock string
	switch mode := os.Getenv("IPTABLES_TEST_NSS_MODE"); mode {
	case "legacy":
	case "legacy before 1.8.6":
		// A release that takes the node's lock: the restore runs with both
		// masks, the namespace's lock over the node's and nsswitch.conf's.
		nodeLock = fakeLegacy184(t)
		cfg.NativeStateDir = stateDir
	case "nft":
		// No NativeStateDir: every write is an iptables-nft-restore.
		cfg.Mode = ModeNFT
	default:
		t.Fatalf("unknown mode %q", mode)
	}
	b, err := NewBackend(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if nodeLock != "" {
		b.nodeLock = nodeLock
		if !b.masksNodeLock() {
			t.Fatal("the wrapper's node lock is not masked")
		}
		// Another iptables user holds the node's lock meanwhile: the restore
		// ends only if its lock is masked too.
		holdLock(t, nodeLock)
	}

	ns := newNS(t)
	var dns *net.UDPConn
	if err := netns.Do(ns, func() error {
		var err error
		dns, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 53})
		return err
	}); err != nil {
		t.Fatalf("listen on the pod's 127.0.0.1:53: %v", err)
	}
	var (
		mu      sync.Mutex
		queries []string
		served  = make(chan struct{})
	)
	go func() {
		defer close(served)
		buf := make([]byte, 512)
		for {
			n, from, err := dns.ReadFromUDP(buf)
			if err != nil {
				return
			}
			mu.Lock()
			queries = append(queries, dnsName(buf[:n]))
			mu.Unlock()
			if n >= 12 {
				buf[2] |= 0x80                // a response
				buf[3] = buf[3]&0xf0 | 5      // REFUSED: the resolver gives up at once
				dns.WriteToUDP(buf[:n], from) //nolint:errcheck
			}
		}
	}()

	plan := specs.Sidecar().Plan(t)
	layouts, err := planLayouts(plan)
	if err != nil {
		t.Fatal(err)
	}
	if text := restoreText(layouts[redirect.IPv4], nil); !strings.Contains(text, "--uid-owner 1337") {
		t.Fatalf("the plan has no owner match, so nothing would look a user up:\n%s", text)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := capture.Apply(ctx, ns, b, plan); err != nil {
		t.Fatalf("apply: %v", err)
	}
	t.Logf("apply took %v", time.Since(start).Round(time.Millisecond))
	dns.Close()
	<-served
	if len(queries) > 0 {
		t.Errorf("the restores asked the node's user and group server from the pod's network namespace: %q", queries)
	}
	if diffs, err := capture.Verify(context.Background(), ns, b, plan); err != nil || len(diffs) > 0 {
		t.Fatalf("verify after apply: %v %q", err, diffs)
	}
}

// dnsName is a DNS query's first question name, for the failure message.
func dnsName(msg []byte) string {
	var labels []string
	for i := 12; i < len(msg) && msg[i] != 0; {
		n := int(msg[i])
		if n > 63 || i+1+n > len(msg) {
			break
		}
		labels = append(labels, string(msg[i+1:i+1+n]))
		i += 1 + n
	}
	return strings.Join(labels, ".")
}

// BenchmarkRestoreSandbox is the cost of running a tool with nsswitch.conf masked
// (a thread of its own, a copy of the mount table, two mounts) against running
// it plainly; the copy grows with the node's mounts.
func BenchmarkRestoreSandbox(b *testing.B) {
	root.Require(b)
	dst := filepath.Join(b.TempDir(), "nsswitch.conf")
	if err := os.WriteFile(dst, []byte("passwd: files ldap\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	tool, err := exec.LookPath("true")
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		masks []fileMask
	}{
		{"plain", nil},
		{"masked", []fileMask{{src: os.DevNull, dst: dst, readOnly: true}}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				cmd := exec.Command(tool)
				run := cmd.Run
				if tc.masks != nil {
					run = func() error { return runWithMasks(cmd.Run, tc.masks) }
				}
				if err := run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
