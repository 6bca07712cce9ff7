package timerslack

import (
	"errors"
	"strconv"
	"syscall"
)

// MaxThreads bounds how many threads Widen sets: a process at its start has a
// handful (the Go runtime's four or five); the rest are left as they are.
const MaxThreads = 64

// Widen sets the timer slack of each thread of the process to ns nanoseconds,
// through /proc/<tid>/timerslack_ns for each thread listed in /proc/self/task
// (Linux 4.6 and later; another thread's needs CAP_SYS_NICE, which the plugin
// has as root). A thread the runtime creates later inherits the slack of the
// thread that creates it, which is one of these. It returns how many threads it
// set; a thread that ends meanwhile is skipped, and the first other error is
// returned after trying them all. (/proc/<tid> is not confined to this process: a
// thread that ended between the listing and its write, its id taken by another
// process's thread, would have that thread set instead. The Go runtime ends no
// thread while packages initialise, where package widen calls it.)
//
// It needs only the syscall, errors and strconv packages, so that a package can
// call it early in the process's initialisation (see package widen).
func Widen(ns uint64) (int, error) {
	if ns == 0 {
		return 0, errors.New("timer slack: 0 would reset it to the default")
	}
	task, err := syscall.Open("/proc/self/task", syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return 0, &Error{Op: "open /proc/self/task", Err: err}
	}
	defer syscall.Close(task)
	proc, err := syscall.Open("/proc", syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return 0, &Error{Op: "open /proc", Err: err}
	}
	defer syscall.Close(proc)
	var tids []string
	var buf [4096]byte
	for len(tids) < MaxThreads {
		n, err := syscall.Getdents(task, buf[:])
		if err != nil {
			return 0, &Error{Op: "list /proc/self/task", Err: err}
		}
		if n <= 0 {
			break
		}
		_, _, tids = syscall.ParseDirent(buf[:n], MaxThreads-len(tids), tids)
	}
	value := strconv.AppendUint(nil, ns, 10)
	set := 0
	var first error
	for _, tid := range tids {
		name := tid + "/timerslack_ns"
		if err := write(proc, name, value); err != nil {
			if err == syscall.ENOENT || err == syscall.ESRCH {
				continue // the thread ended
			}
			if first == nil {
				first = &Error{Op: "write /proc/" + name, Err: err}
			}
			continue
		}
		set++
	}
	return set, first
}

// Error is a failure of Widen: what it did, and the system call's error.
type Error struct {
	Op  string
	Err error
}

func (e *Error) Error() string { return "timer slack: " + e.Op + ": " + e.Err.Error() }

func (e *Error) Unwrap() error { return e.Err }

func write(dir int, name string, value []byte) error {
	fd, err := syscall.Openat(dir, name, syscall.O_WRONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	_, err = syscall.Write(fd, value)
	if cerr := syscall.Close(fd); err == nil {
		err = cerr
	}
	return err
}
