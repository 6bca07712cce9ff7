package netns_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/testns"
)

// TestDoEntersAndLeavesNamespace proves fn runs in the target namespace and the caller's
// namespace is untouched afterwards.
func TestDoEntersAndLeavesNamespace(t *testing.T) {
	root.Require(t)
	path, err := testns.New(t.TempDir(), "ns")
	if err != nil {
		t.Fatal(err)
	}
	defer testns.Delete(path)
	want, err := netns.ID(path)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := netns.ID("/proc/self/ns/net")
	var inside uint64
	if err := netns.Do(path, func() error {
		var err error
		inside, err = netns.ID("/proc/thread-self/ns/net")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if inside != want {
		t.Errorf("fn ran in namespace %d, want %d", inside, want)
	}
	if after, _ := netns.ID("/proc/self/ns/net"); after != before {
		t.Errorf("caller's namespace changed from %d to %d", before, after)
	}
}

func TestDoRejectsNonNamespace(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "notns")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := netns.Do(f.Name(), func() error { t.Error("fn ran"); return nil }); err == nil {
		t.Error("Do accepted a regular file as a namespace")
	}
	if err := netns.Do("/nonexistent/ns", func() error { t.Error("fn ran"); return nil }); err == nil {
		t.Error("Do accepted a missing path")
	}
}

// TestDoRefusesANamedPipeAtOnce: a FIFO at the namespace's path (a wrong
// CNI_NETNS, istio-iptables --network-namespace, the doctor's path) is refused
// with an error, not waited on until some process opens it for writing: the
// open would block the caller past every bound it has.
func TestDoRefusesANamedPipeAtOnce(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "ns")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- netns.Do(fifo, func() error { t.Error("fn ran"); return nil }) }()
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), fifo) {
			t.Errorf("Do on a named pipe: %v, want an error naming it", err)
		}
	case <-time.After(5 * time.Second):
		// A writer ends the blocked open, so the test's goroutine returns.
		if w, err := os.OpenFile(fifo, os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
			defer w.Close()
		}
		t.Fatal("Do still waits in the open of a named pipe")
	}
}

// requireRoot fails (never skips) a test that needs root: CI runs as root, and a
// silent skip would hide missing coverage.

// TestNewLeavesNoThreadBehind: creating namespaces (testns.New unshares inside Do) must
// not move any of the process's threads into them (the main thread in particular:
// /proc/self follows it).
func TestNewLeavesNoThreadBehind(t *testing.T) {
	root.Require(t)
	before, err := netns.ID("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for i := 0; i < 50; i++ {
		p, err := testns.New(dir, fmt.Sprint("ns", i))
		if err != nil {
			t.Fatal(err)
		}
		defer testns.Delete(p)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		id, err := netns.ID("/proc/self/task/" + task.Name() + "/ns/net")
		if err != nil {
			continue // the thread ended meanwhile
		}
		if id != before {
			t.Errorf("thread %s is in namespace %d, want %d", task.Name(), id, before)
		}
	}
	if after, _ := netns.ID("/proc/self/ns/net"); after != before {
		t.Errorf("/proc/self/ns/net moved from %d to %d", before, after)
	}
}
