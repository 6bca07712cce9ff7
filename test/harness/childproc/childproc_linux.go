// Package childproc runs the long-lived servers of the local control plane and node
// (etcd, kube-apiserver, containerd, kubelet, ...) as children: each in its own
// process group with its output in a log file, started from one dedicated OS thread,
// stopped with SIGTERM then SIGKILL.
package childproc

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// Launcher forks every child from one OS thread that lives as long as the launcher.
// Pdeathsig fires when the thread that forked the child exits, not the process; Go
// may retire an ordinary thread at any time (for example one left locked in another
// network namespace), which would kill the servers at random.
type Launcher struct{ reqs chan func() }

// NewLauncher starts the launcher's thread. Close it after every child has exited.
func NewLauncher() *Launcher {
	l := &Launcher{reqs: make(chan func())}
	go func() {
		runtime.LockOSThread()
		for f := range l.reqs {
			f()
		}
		runtime.UnlockOSThread()
	}()
	return l
}

// Close ends the launcher's thread; call it only after every child has exited.
func (l *Launcher) Close() { close(l.reqs) }

// Process is one long-running child with its output in a log file.
type Process struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	log     *os.File
	exited  chan struct{} // closed once Wait returns
	waitErr error         // valid after exited is closed
}

// Start runs bin with args and, besides PATH and HOME, only env: a KUBECONFIG or
// proxy from the caller's shell must not change what the servers do. Output is
// appended to logPath after a line naming the command. The child leads its own
// process group (a Ctrl-C aimed at the caller must not kill it behind Stop's back)
// and is killed if the caller dies.
func (l *Launcher) Start(name, bin string, args, env []string, logPath string) (*Process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create %s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()}, env...)
	fmt.Fprintf(logFile, "# %s %s\n", bin, strings.Join(args, " "))
	errc := make(chan error, 1)
	l.reqs <- func() { errc <- cmd.Start() }
	if err := <-errc; err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, log: logFile, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// Pid is the child's process id (and its process group's).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited is closed once the child has exited and been reaped.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Running reports whether the child has not exited yet.
func (p *Process) Running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Stop sends SIGTERM to the child's process group, SIGKILL after grace, and waits
// until the child is reaped. A nil process is already stopped.
func (p *Process) Stop(grace time.Duration) error {
	if p == nil {
		return nil
	}
	defer p.log.Close()
	if !p.Running() {
		return nil
	}
	pid := p.Pid()
	if err := signalGroup(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop %s: %w", p.Name, err)
	}
	select {
	case <-p.exited:
	case <-time.After(grace):
		if err := signalGroup(pid, syscall.SIGKILL); err != nil {
			return fmt.Errorf("kill %s: %w", p.Name, err)
		}
		<-p.exited
	}
	// Helpers the server forked into its group must not outlive it.
	_ = signalGroup(pid, syscall.SIGKILL)
	return nil
}

func signalGroup(pid int, sig syscall.Signal) error {
	// Negative pid: the whole process group the child leads.
	if err := syscall.Kill(-pid, sig); err != nil && err != syscall.ESRCH {
		return fmt.Errorf("signal process group %d: %w", pid, err)
	}
	return nil
}

// Tail returns the last lines of the child's log, for error messages.
func (p *Process) Tail(lines int) string { return TailFile(p.LogPath, lines) }

// ExitError says how a child that should be serving ended, with the end of its log,
// which is where the reason is.
func (p *Process) ExitError() error {
	return fmt.Errorf("%s exited (%v); last lines of %s:\n%s", p.Name, p.waitErr, p.LogPath, p.Tail(30))
}

// TailFile returns the last lines of a file (reading at most its last 64 KiB).
func TailFile(path string, lines int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	defer f.Close()
	const maxBytes = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > maxBytes {
		if _, err := f.Seek(fi.Size()-maxBytes, io.SeekStart); err != nil {
			return fmt.Sprintf("(cannot read %s: %v)", path, err)
		}
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}
