package unixsock

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/test/harness/shortdir"
)

// TestASocketHasItsModeWhateverTheUmask: under umask 0 a socket bound at its path
// would be world-writable (anyone could connect) until a chmod; placed, it is at
// its mode from the start, and nothing of the making is left.
func TestASocketHasItsModeWhateverTheUmask(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := shortdir.New(t)
	l, err := Listen("unixpacket", filepath.Join(dir, "pseq.sock"), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	d, err := ListenPacket(filepath.Join(dir, "plog.sock"), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("dir holds %v, want the two sockets only", entries)
	}
	for _, e := range entries {
		fi, err := os.Lstat(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want a socket of mode 0600", e.Name(), fi.Mode())
		}
	}
	c, err := net.Dial("unixpacket", filepath.Join(dir, "pseq.sock"))
	if err != nil {
		t.Fatalf("the placed socket does not answer: %v", err)
	}
	c.Close()
}

// TestANewSocketTakesTheOldOnesPlaceInOneStep: a plugin connecting while the next
// agent takes the socket over reaches the old socket or the new one; removing the
// old one before binding left a moment with no socket (ENOENT).
func TestANewSocketTakesTheOldOnesPlaceInOneStep(t *testing.T) {
	path := filepath.Join(shortdir.New(t), "log.sock")
	old, err := Listen("unix", path, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	var failed atomic.Value
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			c, err := net.Dial("unix", path)
			if errors.Is(err, syscall.EAGAIN) {
				continue // a listener's backlog is full: these listeners never accept
			}
			if err != nil {
				failed.CompareAndSwap(nil, err.Error())
				continue
			}
			c.Close()
		}
	}()
	time.Sleep(5 * time.Millisecond)
	var news []*net.UnixListener
	for range 300 {
		l, err := Listen("unix", path, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		news = append(news, l)
	}
	close(stop)
	<-done
	for _, l := range news {
		l.Close()
	}
	if f := failed.Load(); f != nil {
		t.Errorf("a connect during the takeovers failed: %v", f)
	}
}

// TestSomethingElseAtTheSocketsPathIsRefused: a file or directory where the socket
// goes is named and left alone.
func TestSomethingElseAtTheSocketsPathIsRefused(t *testing.T) {
	dir := shortdir.New(t)
	file, sub := filepath.Join(dir, "pods.sock"), filepath.Join(dir, "log.sock")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{file: "a regular file is in the way", sub: "a directory is in the way"} {
		if _, err := Listen("unix", path, 0o600); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), path) {
			t.Errorf("Listen at %s: %v, want an error naming it and %q", path, err, want)
		}
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "x" {
		t.Errorf("the file in the way was touched: %q, %v", b, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("dir holds %v, want what was there only", entries)
	}
}
