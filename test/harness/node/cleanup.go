package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"
)

func saveHost(path string, h *hostBefore) error {
	data, err := json.MarshalIndent(h, "", "  ")
	if err != nil {
		return fmt.Errorf("node: encode host snapshot: %w", err)
	}
	return writeAtomic(path, data, 0o644)
}

// Cleanup removes what a node whose process died (killed, machine reboot) left
// behind in stateDir: it kills the processes that name the state dir (servers,
// containerd's shims), detaches the mounts under it (destroying the pods' network
// namespaces, and with them ptp's veths and routes), restores the host as Up found
// it (from the snapshot Up saved there), and removes the directory. Pods get no CNI
// DEL this way: use Down on a live node. Progress lines go to progress (nil:
// os.Stderr). A missing stateDir is not an error.
func Cleanup(stateDir string, podCIDR netip.Prefix, progress io.Writer) error {
	if progress == nil {
		progress = os.Stderr
	}
	stateDir = filepath.Clean(stateDir)
	if _, err := os.Stat(stateDir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var errs []error
	if pids := processesUsing(stateDir); len(pids) > 0 {
		fmt.Fprintf(progress, "node: killing %d processes of %s\n", len(pids), stateDir)
		killAll(pids)
		time.Sleep(300 * time.Millisecond)
	}
	if err := killContainers(layout{state: stateDir}.runcRoot()); err != nil {
		errs = append(errs, err)
	}
	if err := removeCNICache(layout{state: stateDir}.runcRoot()); err != nil {
		errs = append(errs, err)
	}
	if err := unmountUnder(stateDir); err != nil {
		errs = append(errs, err)
	}
	if data, err := os.ReadFile(layout{state: stateDir}.hostSnapshot()); err == nil {
		var h hostBefore
		if err := json.Unmarshal(data, &h); err != nil {
			errs = append(errs, fmt.Errorf("node: read host snapshot: %w", err))
		} else {
			undone, err := h.restore()
			if err != nil {
				errs = append(errs, err)
			}
			if len(undone) > 0 {
				fmt.Fprintf(progress, "node: host restored: %s\n", strings.Join(undone, ", "))
			}
		}
	}
	if err := os.RemoveAll(stateDir); err != nil {
		errs = append(errs, fmt.Errorf("node: remove %s: %w", stateDir, err))
	}
	if podCIDR.IsValid() {
		// Network namespaces die with their last user; give the kernel a moment.
		deadline := time.Now().Add(5 * time.Second)
		for len(Leftovers(stateDir, podCIDR)) > 0 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if left := Leftovers(stateDir, podCIDR); len(left) > 0 {
			errs = append(errs, fmt.Errorf("node: left on the host after cleanup: %v", left))
		}
	}
	return errors.Join(errs...)
}
