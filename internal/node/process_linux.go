package node

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

// process is one long-running child with its output in a log file.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	log     *os.File
	exited  chan struct{} // closed once Wait returns
	waitErr error         // valid after exited is closed
}

// launcher forks every child from one OS thread that lives as long as the node:
// Pdeathsig fires when the forking thread exits, and Go may retire an ordinary
// thread at any time (for example one left locked in another network namespace).
type launcher struct{ reqs chan func() }

func newLauncher() *launcher {
	l := &launcher{reqs: make(chan func())}
	go func() {
		runtime.LockOSThread()
		for f := range l.reqs {
			f()
		}
	}()
	return l
}

func (l *launcher) start(name, bin string, args, env []string, logPath string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create %s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Own process group: a Ctrl-C aimed at the caller must not kill the servers
	// behind Down's back. Pdeathsig: a caller that dies must not leave them running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// A predictable environment: KUBECONFIG or proxies from the caller's shell must
	// not change what the servers do.
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()}, env...)
	fmt.Fprintf(logFile, "# %s %s\n", bin, strings.Join(args, " "))
	errc := make(chan error, 1)
	l.reqs <- func() { errc <- cmd.Start() }
	if err := <-errc; err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, log: logFile, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// close must be called only after every child has exited.
func (l *launcher) close() { close(l.reqs) }

func (p *process) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM to the process group, SIGKILL after grace, and waits until the
// process is reaped.
func (p *process) stop(grace time.Duration) error {
	if p == nil {
		return nil
	}
	defer p.log.Close()
	if !p.running() {
		return nil
	}
	pid := p.cmd.Process.Pid
	if err := syscall.Kill(-pid, syscall.SIGTERM); err != nil && err != syscall.ESRCH {
		return fmt.Errorf("stop %s: %w", p.name, err)
	}
	select {
	case <-p.exited:
	case <-time.After(grace):
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-p.exited
	}
	// Helpers the server forked into its group must not outlive it.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	return nil
}

// exitError says how a process that should be serving ended, with its log's end.
func (p *process) exitError() error {
	return fmt.Errorf("%s exited (%v); last lines of %s:\n%s", p.name, p.waitErr, p.logPath, tailFile(p.logPath, 30))
}

func tailFile(path string, lines int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	defer f.Close()
	const maxBytes = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > maxBytes {
		f.Seek(fi.Size()-maxBytes, io.SeekStart)
	}
	data, _ := io.ReadAll(f)
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}
