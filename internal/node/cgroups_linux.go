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
	CgroupPaths map[string]string `json:"cgroup_paths"`
}

// killContainers kills every process of the containers runc knows under runcRoot
// (their cgroups' members and init) and removes their cgroups. Normally containerd
// has done both; this is for a containerd or shim that died first.
func killContainers(runcRoot string) error {
	states, _ := filepath.Glob(filepath.Join(runcRoot, "*", "*", "state.json"))
	var errs []error
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
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if c.InitPid > 0 {
			_ = syscall.Kill(c.InitPid, syscall.SIGKILL)
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
