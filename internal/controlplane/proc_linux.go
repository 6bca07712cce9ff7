package controlplane

import (
	"fmt"
	"os"
	"runtime"
	"syscall"
)

// sysProcAttr puts each server in its own process group, so a Ctrl-C aimed at the
// test or CLI does not kill it behind Stop's back, and asks the kernel to kill it
// if its parent goes away (a test binary killed by its timeout must not leave
// servers running).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// launcher starts processes from one OS thread that stays alive for the life of the
// control plane. Pdeathsig fires when the thread that forked the child exits, not the
// process; Go may retire an ordinary thread (for example one left locked in another
// network namespace by netns code in the same test binary), which would kill the
// servers at random.
type launcher struct {
	reqs chan func()
}

func newLauncher() *launcher {
	l := &launcher{reqs: make(chan func())}
	go func() {
		runtime.LockOSThread()
		for f := range l.reqs {
			f()
		}
		runtime.UnlockOSThread()
	}()
	return l
}

func (l *launcher) do(f func() error) error {
	errc := make(chan error, 1)
	l.reqs <- func() { errc <- f() }
	return <-errc
}

// close must be called only after every child has exited.
func (l *launcher) close() { close(l.reqs) }

func signalGroup(pid int, sig syscall.Signal) error {
	// Negative pid: the whole process group the child leads.
	if err := syscall.Kill(-pid, sig); err != nil && err != syscall.ESRCH {
		return fmt.Errorf("signal process group %d: %w", pid, err)
	}
	return nil
}

// processGone reports whether no process with this pid exists any more.
func processGone(pid int) bool {
	return syscall.Kill(pid, 0) == syscall.ESRCH
}

func lockFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
