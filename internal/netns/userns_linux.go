package netns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ownUserNamespace is this process's user namespace (its device and inode). A Go
// process never leaves it (joining another takes a single-threaded process), so it
// is read once.
var ownUserNamespace = sync.OnceValues(func() (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Stat("/proc/self/ns/user", &st)
	return st, err
})

// ForeignOwner returns a descriptor of the user namespace that owns the network
// namespace at path when that is not this process's user namespace, and -1 when
// it is. The runtimes make the network namespace of a pod with hostUsers: false
// inside the pod's own user namespace (containerd 2, CRI-O). The caller closes the
// descriptor (it is close-on-exec). An error means it cannot be told: a kernel
// before 4.9 (no NS_GET_USERNS), or an owner outside this process's view.
func ForeignOwner(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer unix.Close(fd)
	owner, err := unix.IoctlRetInt(fd, unix.NS_GET_USERNS)
	if err != nil {
		return -1, fmt.Errorf("user namespace of %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(owner, &st); err != nil {
		unix.Close(owner)
		return -1, fmt.Errorf("user namespace of %s: %w", path, err)
	}
	own, err := ownUserNamespace()
	if err != nil {
		unix.Close(owner)
		return -1, fmt.Errorf("own user namespace: %w", err)
	}
	if st.Dev == own.Dev && st.Ino == own.Ino {
		unix.Close(owner)
		return -1, nil
	}
	return owner, nil
}

// RunInUserNamespace runs cmd as cmd.Run does, but in the user namespace whose
// descriptor is owner (from ForeignOwner) and in the calling thread's other
// namespaces: its network namespace (the caller is in Do's fn) and its mount
// namespace. The command keeps this process's uid and gid, so it opens files
// as a command run by cmd.Run would, and of its capabilities only caps (CAP_*
// numbers below 64), which count in owner and the namespaces owner owns. ctx
// kills the command when it ends, as for exec.CommandContext; cmd.WaitDelay
// then bounds the wait for its output. cmd must be made by exec.Command or
// exec.CommandContext with an absolute path, and without Dir, ExtraFiles or
// SysProcAttr; its Stdin, Stdout and Stderr are used as cmd.Run uses them.
//
// Why not cmd.Run with SysProcAttr: joining a user namespace (setns(2) with
// CLONE_NEWUSER) takes a single-threaded process, which a Go process never is,
// and none of the steps the os/exec child takes between its fork and its exec
// joins an existing namespace. So the child is forked here, a plain fork (its
// own copy of the memory, with only the calling thread), and until it execs it
// makes system calls and nothing else: it joins owner, keeps caps (joining
// gives it every capability in owner, but execve computes them again from its
// uid, which is not owner's root, and would drop them all: they are kept as
// ambient capabilities), puts its stdin, stdout and stderr in place, sets its
// signal handlers back to the defaults and execs. A failure of any step is
// reported through a close-on-exec pipe, naming the step.
func RunInUserNamespace(ctx context.Context, owner int, caps []uintptr, cmd *exec.Cmd) error {
	if cmd.Err != nil {
		return cmd.Err
	}
	if cmd.Process != nil {
		return errors.New("exec: already started")
	}
	if !strings.HasPrefix(cmd.Path, "/") || cmd.Dir != "" || len(cmd.ExtraFiles) > 0 || cmd.SysProcAttr != nil {
		return fmt.Errorf("run %s in a user namespace: only an absolute path, without Dir, ExtraFiles or SysProcAttr", cmd.Path)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var s forkSpec
	var err error
	for _, c := range caps {
		if c >= 64 {
			return fmt.Errorf("run %s in a user namespace: capability %d is not below 64", cmd.Path, c)
		}
		s.ambient |= 1 << c
	}
	s.caps.hdr.Version = unix.LINUX_CAPABILITY_VERSION_3
	for i := range s.caps.data {
		bits := uint32(s.ambient >> (32 * i))
		s.caps.data[i] = unix.CapUserData{Effective: bits, Permitted: bits, Inheritable: bits}
	}
	env := cmd.Env
	if env == nil {
		env = os.Environ()
	}
	if s.path, err = syscall.BytePtrFromString(cmd.Path); err != nil {
		return err
	}
	argv, err := syscall.SlicePtrFromStrings(cmd.Args)
	if err != nil {
		return err
	}
	envv, err := syscall.SlicePtrFromStrings(dedupEnv(env))
	if err != nil {
		return err
	}
	s.argv, s.envv = &argv[0], &envv[0]
	s.owner = uintptr(owner)
	s.all = ^uint64(0)

	// The child's stdin, stdout and stderr, and what copies to and from them.
	var childFiles [3]*os.File
	var parentEnds []*os.File
	var copies []func() error
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	var childEnds []*os.File
	defer func() { closeAll(childEnds) }()
	devNull := func() (*os.File, error) {
		f, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
		if err == nil {
			childEnds = append(childEnds, f)
		}
		return f, err
	}
	switch r := cmd.Stdin.(type) {
	case nil:
		if childFiles[0], err = devNull(); err != nil {
			return err
		}
	case *os.File:
		childFiles[0] = r
	default:
		pr, pw, err := os.Pipe()
		if err != nil {
			return err
		}
		childEnds, parentEnds = append(childEnds, pr), append(parentEnds, pw)
		childFiles[0] = pr
		copies = append(copies, func() error {
			_, err := io.Copy(pw, r)
			if errors.Is(err, syscall.EPIPE) || errors.Is(err, os.ErrClosed) {
				err = nil // the command stopped reading, as cmd.Run tolerates
			}
			if cerr := pw.Close(); err == nil && !errors.Is(cerr, os.ErrClosed) {
				err = cerr
			}
			return err
		})
	}
	for i, w := range []io.Writer{cmd.Stdout, cmd.Stderr} {
		if i == 1 && sameWriter(cmd.Stdout, cmd.Stderr) {
			childFiles[2] = childFiles[1] // one pipe, one copy, as cmd.Run does
			continue
		}
		switch w := w.(type) {
		case nil:
			if childFiles[1+i], err = devNull(); err != nil {
				closeAll(parentEnds)
				return err
			}
		case *os.File:
			childFiles[1+i] = w
		default:
			pr, pw, err := os.Pipe()
			if err != nil {
				closeAll(parentEnds)
				return err
			}
			childEnds, parentEnds = append(childEnds, pw), append(parentEnds, pr)
			childFiles[1+i] = pw
			copies = append(copies, func() error {
				_, err := io.Copy(w, pr)
				pr.Close()
				if errors.Is(err, os.ErrClosed) {
					err = nil // closed at the end of WaitDelay: reported as that
				}
				return err
			})
		}
	}
	report, reportW, err := os.Pipe()
	if err != nil {
		closeAll(parentEnds)
		return err
	}
	defer report.Close()
	next := int(reportW.Fd())
	for i, f := range childFiles {
		s.fds[i] = f.Fd()
		next = max(next, int(f.Fd()))
	}
	s.report, s.next = reportW.Fd(), uintptr(next+1)

	// The fork must be the calling thread's: its namespaces are the child's.
	runtime.LockOSThread()
	syscall.ForkLock.Lock()
	pid, errno := forkInUserNamespace(&s)
	syscall.ForkLock.Unlock()
	runtime.UnlockOSThread()
	runtime.KeepAlive(argv)
	runtime.KeepAlive(envv)
	reportW.Close()
	closeAll(childEnds)
	childEnds = nil
	if errno != 0 {
		closeAll(parentEnds)
		return fmt.Errorf("fork/exec %s: fork: %w", cmd.Path, errno)
	}
	var failed [2]uintptr
	n, _ := io.ReadFull(report, unsafe.Slice((*byte)(unsafe.Pointer(&failed[0])), unsafe.Sizeof(failed)))
	if n > 0 {
		var ws unix.WaitStatus
		for {
			if _, err := unix.Wait4(int(pid), &ws, 0, nil); !errors.Is(err, unix.EINTR) {
				break
			}
		}
		closeAll(parentEnds)
		return fmt.Errorf("fork/exec %s: %s: %w", cmd.Path, forkStep(failed[0]), syscall.Errno(failed[1]))
	}
	p, err := os.FindProcess(int(pid))
	if err != nil {
		closeAll(parentEnds)
		return fmt.Errorf("fork/exec %s: %w", cmd.Path, err)
	}
	cmd.Process = p

	copyErrs := make(chan error, len(copies))
	for _, c := range copies {
		go func() { copyErrs <- c() }()
	}
	exited := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			p.Kill()
		case <-exited:
		}
	}()
	state, werr := p.Wait()
	close(exited)
	cmd.ProcessState = state

	var copyErr error
	var delay <-chan time.Time
	if cmd.WaitDelay > 0 {
		t := time.NewTimer(cmd.WaitDelay)
		defer t.Stop()
		delay = t.C
	}
	timedOut := false
	for range copies {
		select {
		case err := <-copyErrs:
			if copyErr == nil {
				copyErr = err
			}
		case <-delay:
			// A child of the command holds its output open: stop reading.
			closeAll(parentEnds)
			timedOut, delay = true, nil
			if err := <-copyErrs; copyErr == nil {
				copyErr = err
			}
		}
	}
	switch {
	case werr != nil:
		return werr
	case !state.Success():
		return &exec.ExitError{ProcessState: state}
	case copyErr != nil:
		return copyErr
	case timedOut:
		return exec.ErrWaitDelay
	}
	return nil
}

// sameWriter says whether a and b are one writer (as os/exec tells: values of a
// type that cannot be compared are not).
func sameWriter(a, b io.Writer) (same bool) {
	defer func() { _ = recover() }()
	return a == b
}

// dedupEnv keeps the last of each name's values, as os/exec does: the C library
// reads the first.
func dedupEnv(env []string) []string {
	seen := make(map[string]bool, len(env))
	out := make([]string, 0, len(env))
	for i := len(env) - 1; i >= 0; i-- {
		name, _, _ := strings.Cut(env[i], "=")
		if seen[name] {
			continue
		}
		seen[name] = true
		out = append(out, env[i])
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// forkSpec is everything the forked child uses, made before the fork: after it the
// child makes system calls only (no allocation, no call that could grow its stack).
type forkSpec struct {
	path       *byte
	argv, envv **byte // the first of nil-terminated arrays
	owner      uintptr
	fds        [3]uintptr // the child's stdin, stdout and stderr
	report     uintptr    // the failure pipe's write end (close-on-exec)
	next       uintptr    // above every descriptor of the above
	ambient    uint64     // the capabilities kept, as bits
	caps       struct {
		hdr  unix.CapUserHeader
		data [2]unix.CapUserData
	}
	all, mask uint64 // every signal; the calling thread's signal mask
}

// The steps of the child, as it reports a failure.
const (
	stepJoin = iota + 1
	stepCaps
	stepAmbient
	stepFiles
	stepSignals
	stepExec
)

func forkStep(step uintptr) string {
	switch step {
	case stepJoin:
		return "join the user namespace (setns)"
	case stepCaps:
		return "keep the capabilities (capset)"
	case stepAmbient:
		return "keep the capabilities across exec (PR_CAP_AMBIENT_RAISE)"
	case stepFiles:
		return "set up stdin, stdout and stderr (dup3)"
	case stepSignals:
		return "restore the signal handlers and mask"
	case stepExec:
		return "exec"
	}
	return fmt.Sprintf("step %d", step)
}

// The handlers a sigaction names by number.
const (
	sigDfl = 0
	sigIgn = 1
)

// sigsetBytes is the kernel's signal set size on the architectures Go runs Linux
// on but MIPS (_NSIG / 8).
const sigsetBytes = 8

// forkInUserNamespace forks; the child runs childInUserNamespace and never
// returns. All signals are blocked across the fork (on the calling thread, which
// the caller locked), so that no Go signal handler runs in the child, and the
// parent's mask is put back after it. It is nosplit and makes raw system calls
// only, as the runtime's own fork does; norace, as the race detector's calls
// must not run in the child.
//
//go:norace
//go:nosplit
func forkInUserNamespace(s *forkSpec) (pid uintptr, errno syscall.Errno) {
	syscall.RawSyscall6(unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, uintptr(unsafe.Pointer(&s.all)), uintptr(unsafe.Pointer(&s.mask)), sigsetBytes, 0, 0)
	if runtime.GOARCH == "s390x" {
		pid, _, errno = syscall.RawSyscall6(unix.SYS_CLONE, 0, uintptr(unix.SIGCHLD), 0, 0, 0, 0)
	} else {
		pid, _, errno = syscall.RawSyscall6(unix.SYS_CLONE, uintptr(unix.SIGCHLD), 0, 0, 0, 0, 0)
	}
	if errno == 0 && pid == 0 {
		childInUserNamespace(s)
	}
	syscall.RawSyscall6(unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, uintptr(unsafe.Pointer(&s.mask)), 0, sigsetBytes, 0, 0)
	return pid, errno
}

// childInUserNamespace is the forked child until its exec (see RunInUserNamespace).
//
//go:norace
//go:nosplit
func childInUserNamespace(s *forkSpec) {
	var (
		step, i, sig uintptr
		errno        syscall.Errno
		action       [8]uintptr // the kernel's struct sigaction, with room to spare
		dfl          [8]uintptr // SIG_DFL, no flags, an empty mask
		failed       [2]uintptr
	)
	if _, _, errno = syscall.RawSyscall(unix.SYS_SETNS, s.owner, unix.CLONE_NEWUSER, 0); errno != 0 {
		step = stepJoin
		goto fail
	}
	if _, _, errno = syscall.RawSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&s.caps.hdr)), uintptr(unsafe.Pointer(&s.caps.data[0])), 0); errno != 0 {
		step = stepCaps
		goto fail
	}
	for i = 0; i < 64; i++ {
		if s.ambient&(1<<i) == 0 {
			continue
		}
		if _, _, errno = syscall.RawSyscall6(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE, i, 0, 0, 0); errno != 0 {
			step = stepAmbient
			goto fail
		}
	}
	// Every descriptor below 3 moves up first, so that the moves down onto 0, 1
	// and 2 cannot overwrite one still to be moved.
	step = stepFiles
	if s.report < 3 {
		if _, _, errno = syscall.RawSyscall(unix.SYS_DUP3, s.report, s.next, unix.O_CLOEXEC); errno != 0 {
			goto fail
		}
		s.report, s.next = s.next, s.next+1
	}
	for i = 0; i < 3; i++ {
		if s.fds[i] < 3 {
			if _, _, errno = syscall.RawSyscall(unix.SYS_DUP3, s.fds[i], s.next, unix.O_CLOEXEC); errno != 0 {
				goto fail
			}
			s.fds[i], s.next = s.next, s.next+1
		}
	}
	for i = 0; i < 3; i++ {
		if _, _, errno = syscall.RawSyscall(unix.SYS_DUP3, s.fds[i], i, 0); errno != 0 {
			goto fail
		}
	}
	// The Go runtime's handlers are this process's until the exec, which resets
	// them; a signal that came before would run one with no runtime behind it.
	// Signals ignored stay ignored, as across an exec.
	step = stepSignals
	for sig = 1; sig < 65; sig++ {
		if sig == uintptr(unix.SIGKILL) || sig == uintptr(unix.SIGSTOP) {
			continue
		}
		if _, _, errno = syscall.RawSyscall6(unix.SYS_RT_SIGACTION, sig, 0, uintptr(unsafe.Pointer(&action[0])), sigsetBytes, 0, 0); errno != 0 {
			continue // not a signal of this kernel
		}
		if action[0] != sigIgn && action[0] != sigDfl {
			syscall.RawSyscall6(unix.SYS_RT_SIGACTION, sig, uintptr(unsafe.Pointer(&dfl[0])), 0, sigsetBytes, 0, 0)
		}
	}
	if _, _, errno = syscall.RawSyscall6(unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, uintptr(unsafe.Pointer(&s.mask)), 0, sigsetBytes, 0, 0); errno != 0 {
		goto fail
	}
	_, _, errno = syscall.RawSyscall(unix.SYS_EXECVE, uintptr(unsafe.Pointer(s.path)), uintptr(unsafe.Pointer(s.argv)), uintptr(unsafe.Pointer(s.envv)))
	step = stepExec

fail:
	failed[0], failed[1] = step, uintptr(errno)
	syscall.RawSyscall(unix.SYS_WRITE, s.report, uintptr(unsafe.Pointer(&failed[0])), unsafe.Sizeof(failed))
	for {
		syscall.RawSyscall(unix.SYS_EXIT_GROUP, 127, 0, 0)
	}
}
