package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// containerdCgroupParents are the cgroup directories runc creates for containerd's
// CRI namespace when kubelet gives no cgroup parent (cgroupsPerQOS off): one
// /sys/fs/cgroup/HIERARCHY/k8s.io per cgroup v1 hierarchy (plus unified). runc
// removes each container's cgroup but leaves this parent.
func containerdCgroupParents() []string {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/k8s.io")
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		dirs = append(dirs, "/sys/fs/cgroup/k8s.io") // cgroup v2
	}
	return dirs
}

// runcContainer is what runc's state.json says about a container.
type runcContainer struct {
	InitPid     int               `json:"init_process_pid"`
	InitStart   uint64            `json:"init_process_start"`
	CgroupPaths map[string]string `json:"cgroup_paths"`
}

// reapWait bounds how long killContainers waits for killed container processes to
// be reaped: once their shim is gone they are reparented to PID 1, which may take
// a moment.
const reapWait = 10 * time.Second

// killContainers kills every process of the containers runc knows under runcRoot
// (their cgroups' members and init), removes their cgroups, and waits (up to
// reapWait) until the processes are gone, zombies included. Normally containerd
// has done all of it; this is for a containerd or shim that died first.
func killContainers(runcRoot string) error {
	states, _ := filepath.Glob(filepath.Join(runcRoot, "*", "*", "state.json"))
	var errs []error
	var killed []int
	defer func() {
		deadline := time.Now().Add(reapWait)
		for _, pid := range killed {
			for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}()
	for _, path := range states {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		var c runcContainer
		if err := json.Unmarshal(data, &c); err != nil {
			errs = append(errs, fmt.Errorf("node: read %s: %w", path, err))
			continue
		}
		for _, cg := range c.CgroupPaths {
			for _, pid := range cgroupProcs(cg) {
				if syscall.Kill(pid, syscall.SIGKILL) == nil {
					killed = append(killed, pid)
				}
			}
		}
		// A pid is only the container's while its start time is the one runc saw:
		// a dead container's pid may belong to someone else now.
		if c.InitPid > 0 && startTime(c.InitPid) == c.InitStart && syscall.Kill(c.InitPid, syscall.SIGKILL) == nil {
			killed = append(killed, c.InitPid)
		}
		for _, cg := range c.CgroupPaths {
			if err := rmdirCgroup(cg); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func cgroupProcs(dir string) []int {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// rmdirCgroup removes a cgroup directory, waiting briefly for killed members to go.
func rmdirCgroup(dir string) error {
	deadline := time.Now().Add(3 * time.Second)
	for {
		err := syscall.Rmdir(dir)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("node: remove cgroup %s: %w", dir, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// removeCNICache removes libcni's cached results (/var/lib/cni/results) of the
// sandboxes runc knows under runcRoot: libcni deletes them on DEL, which a dead
// containerd never ran. Only our network's and containerd's loopback entries of our
// own sandbox ids are touched.
func removeCNICache(runcRoot string) error {
	ids, _ := filepath.Glob(filepath.Join(runcRoot, "*", "*"))
	var errs []error
	for _, dir := range ids {
		id := filepath.Base(dir)
		for _, net := range []string{networkName, "cni-loopback"} {
			matches, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", net+"-"+id+"-*"))
			for _, m := range matches {
				if err := os.Remove(m); err != nil && !errors.Is(err, os.ErrNotExist) {
					errs = append(errs, fmt.Errorf("node: remove %s: %w", m, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// startTime is field 22 of /proc/PID/stat (clock ticks after boot); 0 when the
// process is gone.
func startTime(pid int) uint64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces: count from its closing paren.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 {
		return 0
	}
	v, _ := strconv.ParseUint(f[19], 10, 64)
	return v
}
