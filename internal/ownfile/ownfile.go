// Package ownfile removes what a process made in a directory that other processes
// share and take over: the agent's run directory, mounted from the host, where the
// next agent (a rolling update of the DaemonSet) or Istio's own agent (a switch
// between the two DaemonSets) makes its sockets and files while this one is still
// stopping. A path made by one process is taken over by the next by replacing it;
// each process then removes only what is still its own, never what replaced it.
//
// A file is told by its device and inode (os.SameFile), recorded with os.Lstat
// right after the process made it. A file system reuses a freed inode for the next
// file it makes (ext4 at once), so the file must stay allocated until the check,
// even once unlinked by the process taking over: a bound socket keeps its inode
// until the listener is closed; a directory must be held open.
package ownfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// Remove removes path if it is still the file own describes (os.Lstat of it after
// it was made: a socket after binding, a directory after creating it), which must
// still be allocated (see the package doc). A path
// replaced since by another process's file, or gone, is left as it is; own nil
// (the Lstat failed) removes nothing.
func Remove(path string, own os.FileInfo) error {
	if !Is(path, own) {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// RemoveAll removes the directory dir and what it holds if dir is still the one
// own describes, as Remove.
func RemoveAll(dir string, own os.FileInfo) error {
	if !Is(dir, own) {
		return nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// Is reports whether path is still the file own describes (not followed if a
// symbolic link).
func Is(path string, own os.FileInfo) bool {
	if own == nil {
		return false
	}
	now, err := os.Lstat(path)
	return err == nil && os.SameFile(now, own)
}
