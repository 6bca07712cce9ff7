package cniconf

import (
	"bytes"
	"io"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestReplaceAtomicPutsNoFileOpenForWritingInPlace: a binary is renamed into place
// only once its writer has closed it. Linux refuses to exec a file that a process
// holds open for writing (ETXTBSY), and a runtime execs the plugin at any moment:
// CI saw 3 of 47 execs fail while the agent restored the plugin, its temporary
// still open (for its livetemp lock) after the rename. The kernel's inotify
// events, queued in order, tell which came first: the last close of a writable
// descriptor (IN_CLOSE_WRITE) or the rename into place (IN_MOVED_TO).
func TestReplaceAtomicPutsNoFileOpenForWritingInPlace(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "istio-cni")
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO); err != nil {
		t.Fatal(err)
	}
	if err := ReplaceAtomic(target, ".install-tmp-", 0o755, func(w io.Writer) error {
		_, err := w.Write([]byte("#!/bin/sh\nexit 0\n"))
		return err
	}); err != nil {
		t.Fatal(err)
	}

	buf := make([]byte, 64<<10)
	n, err := unix.Read(fd, buf)
	if err != nil {
		t.Fatalf("read inotify events: %v", err)
	}
	var events []string
	for off := 0; off+unix.SizeofInotifyEvent <= n; {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
		name := string(bytes.TrimRight(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)], "\x00"))
		off += unix.SizeofInotifyEvent + int(ev.Len)
		switch {
		case ev.Mask&unix.IN_CLOSE_WRITE != 0:
			events = append(events, "closed for writing "+name)
		case ev.Mask&unix.IN_MOVED_TO != 0:
			events = append(events, "renamed to "+name)
		}
	}
	renamed := -1
	for i, e := range events {
		if e == "renamed to istio-cni" {
			renamed = i
		}
	}
	if renamed < 1 || events[renamed-1] == "renamed to istio-cni" {
		t.Fatalf("events %q: want the temporary closed for writing, then renamed to istio-cni", events)
	}
	for _, e := range events[renamed+1:] {
		t.Errorf("after the rename into place, %s: until then an exec of %s fails with ETXTBSY (events %q)", e, target, events)
	}
}
