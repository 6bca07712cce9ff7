package netns_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// userNamespaceOf is the user namespace of the process holding ns (/proc/PID/ns/net),
// as readlink prints it.
func userNamespaceOf(t *testing.T, ns string) string {
	t.Helper()
	link, err := os.Readlink(strings.TrimSuffix(ns, "net") + "user")
	if err != nil {
		t.Fatal(err)
	}
	return link
}

// TestForeignOwnerOpensTheUserNamespaceOfAPodsNetnsOnly: a namespace of the node's
// user namespace has no foreign owner (-1); the network namespace of a pod with
// hostUsers: false is owned by the pod's user namespace, which ForeignOwner opens.
func TestForeignOwnerOpensTheUserNamespaceOfAPodsNetnsOnly(t *testing.T) {
	root.Require(t)
	plain, err := testns.New(t.TempDir(), "plain")
	if err != nil {
		t.Fatal(err)
	}
	defer testns.Delete(plain)
	for _, ns := range []string{"/proc/self/ns/net", plain} {
		if owner, err := netns.ForeignOwner(ns); owner != -1 || err != nil {
			t.Errorf("ForeignOwner(%s) = %d, %v; want -1 (this process's user namespace)", ns, owner, err)
		}
	}
	pod, owner := podWithOwner(t)
	if got, want := fmt.Sprintf("user:[%d]", fstatIno(t, owner)), userNamespaceOf(t, pod); got != want {
		t.Errorf("ForeignOwner(%s) opened %s, want %s", pod, got, want)
	}
}

func fstatIno(t *testing.T, fd int) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestRunInUserNamespaceRunsInThePodsNamespacesWithTheGivenCapabilities: the command
// runs in the pod's user namespace and in the network namespace of the calling
// thread, with this process's identity (unmapped there: the overflow uid 65534)
// and exactly the capabilities asked for, kept across its exec (effective and
// ambient); its stdin, stdout and stderr are the command's. Another command run
// the ordinary way from the same thread stays in the node's user namespace.
func TestRunInUserNamespaceRunsInThePodsNamespacesWithTheGivenCapabilities(t *testing.T) {
	root.Require(t)
	pod, owner := podWithOwner(t)
	podNet, err := os.Readlink(pod)
	if err != nil {
		t.Fatal(err)
	}
	nodeUser, err := os.Readlink("/proc/self/ns/user")
	if err != nil {
		t.Fatal(err)
	}
	script := `cat; readlink /proc/self/ns/user /proc/self/ns/net; grep -E '^(Uid|CapEff|CapAmb)' /proc/self/status | tr '\t' ' '; echo to-stderr >&2`
	var inPod, ordinary, stderr bytes.Buffer
	err = netns.Do(pod, func() error {
		cmd := exec.Command("/bin/sh", "-c", script)
		cmd.Stdin = strings.NewReader("from-stdin\n")
		cmd.Stdout, cmd.Stderr = &inPod, &stderr
		if err := netns.RunInUserNamespace(context.Background(), owner, []uintptr{unix.CAP_NET_ADMIN, unix.CAP_NET_RAW}, cmd); err != nil {
			return err
		}
		cmd = exec.Command("/bin/sh", "-c", "readlink /proc/self/ns/user")
		cmd.Stdout = &ordinary
		return cmd.Run()
	})
	if err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	want := fmt.Sprintf("from-stdin\n%s\n%s\nUid: 65534 65534 65534 65534\nCapEff: 0000000000003000\nCapAmb: 0000000000003000\n", userNamespaceOf(t, pod), podNet)
	if diff := cmp.Diff(want, inPod.String()); diff != "" {
		t.Errorf("the command in the pod's user namespace printed (-want +got):\n%s", diff)
	}
	if stderr.String() != "to-stderr\n" {
		t.Errorf("its stderr: %q, want %q", stderr.String(), "to-stderr\n")
	}
	if got := strings.TrimSpace(ordinary.String()); got != nodeUser {
		t.Errorf("a command run by cmd.Run on the same thread after it is in %s, want the node's %s", got, nodeUser)
	}
}

// TestRunInUserNamespaceFailsNamingTheStep: a command that exits non-zero gives
// its exit status as cmd.Run does; a step the child cannot take is named with the
// kernel's error (the namespace is not a user namespace: setns; the binary is
// missing: exec); a context that ended kills the command, and a child of it that
// holds its output open is waited for no longer than WaitDelay.
func TestRunInUserNamespaceFailsNamingTheStep(t *testing.T) {
	root.Require(t)
	pod, owner := podWithOwner(t)
	notUser, err := unix.Open(pod, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(notUser)
	caps := []uintptr{unix.CAP_NET_ADMIN}
	run := func(ctx context.Context, owner int, cmd *exec.Cmd) error {
		return netns.Do(pod, func() error { return netns.RunInUserNamespace(ctx, owner, caps, cmd) })
	}

	var ee *exec.ExitError
	if err := run(context.Background(), owner, exec.Command("/bin/sh", "-c", "exit 3")); !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Errorf("a command exiting 3: %v, want an *exec.ExitError of status 3", err)
	}
	err = run(context.Background(), notUser, exec.Command("/bin/true"))
	if !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), "join the user namespace (setns)") {
		t.Errorf("a network namespace given as the user namespace: %v, want EINVAL at joining it", err)
	}
	err = run(context.Background(), owner, exec.Command("/nonexistent/iptables-restore"))
	if !errors.Is(err, syscall.ENOENT) || !strings.Contains(err.Error(), ": exec: ") {
		t.Errorf("a missing binary: %v, want ENOENT at its exec", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	cmd := exec.Command("/bin/sh", "-c", "sleep 5 & wait") // the sleep exits by itself soon after the test
	cmd.Stdout = &bytes.Buffer{}
	cmd.WaitDelay = 200 * time.Millisecond
	start := time.Now()
	err = run(ctx, owner, cmd)
	if !errors.As(err, &ee) || ee.String() != "signal: killed" {
		t.Errorf("a command whose context ended: %v, want it killed", err)
	}
	if took := time.Since(start); took > 100*time.Millisecond+cmd.WaitDelay+2*time.Second {
		t.Errorf("a command whose child holds its output returned after %v, want at most the context's 100ms and WaitDelay's %v", took, cmd.WaitDelay)
	}
}

// podWithOwner makes a network namespace inside a user namespace of its own, as
// a pod with hostUsers: false has, and opens that user namespace (ForeignOwner,
// closed at the test's end).
func podWithOwner(t *testing.T) (pod string, owner int) {
	t.Helper()
	pod = testns.NewInUserNamespace(t)
	owner, err := netns.ForeignOwner(pod)
	if err != nil || owner < 0 {
		t.Fatalf("ForeignOwner(%s) = %d, %v; want the pod's user namespace", pod, owner, err)
	}
	t.Cleanup(func() { unix.Close(owner) })
	return pod, owner
}
