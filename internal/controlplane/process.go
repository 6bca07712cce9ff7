package controlplane

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// process is one server child with its output in a log file.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	log     *os.File
	exited  chan struct{} // closed once Wait returns
	waitErr error         // valid after exited is closed
}

func startProcess(l *launcher, name, bin string, args []string, logPath string) (*process, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("create %s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = sysProcAttr()
	// The servers get a minimal, predictable environment: a proxy or KUBECONFIG
	// from the developer's shell must not change how they behave.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()}
	fmt.Fprintf(logFile, "# %s %s\n", bin, strings.Join(args, " "))
	if err := l.do(cmd.Start); err != nil {
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

func (p *process) pid() int { return p.cmd.Process.Pid }

// running reports whether the process has not exited yet.
func (p *process) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop asks the process to terminate, kills it if it has not done so within grace,
// and waits until it is reaped.
func (p *process) stop(grace time.Duration) error {
	defer p.log.Close()
	if !p.running() {
		return nil
	}
	if err := signalGroup(p.pid(), syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop %s: %w", p.name, err)
	}
	select {
	case <-p.exited:
	case <-time.After(grace):
		if err := signalGroup(p.pid(), syscall.SIGKILL); err != nil {
			return fmt.Errorf("kill %s: %w", p.name, err)
		}
		<-p.exited
	}
	// The group may hold helpers the server forked; none should outlive it.
	_ = signalGroup(p.pid(), syscall.SIGKILL)
	return nil
}

// tail returns the last lines of the process log, for error messages.
func (p *process) tail(lines int) string {
	return tailFile(p.logPath, lines)
}

func tailFile(path string, lines int) string {
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

// exitError describes how a process that should be serving ended, with the end of
// its log, which is where the reason is.
func (p *process) exitError() error {
	return fmt.Errorf("%s exited (%v); last lines of %s:\n%s", p.name, p.waitErr, p.logPath, p.tail(30))
}
