package netns

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// MaxIDMapBytes bounds a uid_map or gid_map file read by ReadIDMaps: the kernel
// takes at most 340 lines of three numbers (about 11 KiB); a larger file is not a
// map the kernel wrote.
const MaxIDMapBytes = 16 << 10

// IDRange is one line of a user namespace's uid_map or gid_map: Length ids from
// Inside, in the namespace, are Outside, in the namespace of the process that read
// the map.
type IDRange struct {
	Inside, Outside, Length uint32
}

// IDMap is a user namespace's uid or gid map.
type IDMap []IDRange

// Outside returns what id in the namespace is outside it; ok is false when the map
// does not map it.
func (m IDMap) Outside(id uint32) (out uint32, ok bool) {
	for _, r := range m {
		if id >= r.Inside && uint64(id) < uint64(r.Inside)+uint64(r.Length) {
			return r.Outside + (id - r.Inside), true
		}
	}
	return 0, false
}

// ParseIDMap reads the text of a uid_map or gid_map file (user_namespaces(7)).
func ParseIDMap(text string) (IDMap, error) {
	var m IDMap
	for i, line := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 {
			return nil, fmt.Errorf("line %d %q: want three numbers", i+1, line)
		}
		var n [3]uint32
		for j, s := range f {
			v, err := strconv.ParseUint(s, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("line %d %q: %w", i+1, line, err)
			}
			n[j] = uint32(v)
		}
		m = append(m, IDRange{Inside: n[0], Outside: n[1], Length: n[2]})
	}
	return m, nil
}

// ReadIDMaps reads the uid and gid maps of the user namespace owner (a descriptor
// from ForeignOwner) through proc, the /proc directory of a process in it
// (/proc/PID, or the node's through the agent's /host/proc): a user namespace's
// maps can only be read through one of its processes. The ids outside are this
// process's (the node's, for the agent and the doctor), as the kernel writes them
// for a reader in another user namespace. It fails when proc's process is not in
// owner (gone, its pid reused).
func ReadIDMaps(proc string, owner int) (uid, gid IDMap, err error) {
	var want, got unix.Stat_t
	if err := unix.Fstat(owner, &want); err != nil {
		return nil, nil, fmt.Errorf("user namespace: %w", err)
	}
	nsPath := filepath.Join(proc, "ns", "user")
	if err := unix.Stat(nsPath, &got); err != nil {
		return nil, nil, fmt.Errorf("user namespace of %s: %w", proc, err)
	}
	if got.Dev != want.Dev || got.Ino != want.Ino {
		return nil, nil, fmt.Errorf("%s is in user namespace %d, not the network namespace's owner %d (the process is gone, or its pid was reused)", nsPath, got.Ino, want.Ino)
	}
	read := func(name string) (IDMap, error) {
		path := filepath.Join(proc, name)
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		data, err := io.ReadAll(io.LimitReader(f, MaxIDMapBytes+1))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
		if len(data) > MaxIDMapBytes {
			return nil, fmt.Errorf("%s: over %d bytes", path, MaxIDMapBytes)
		}
		m, err := ParseIDMap(string(data))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return m, nil
	}
	if uid, err = read("uid_map"); err != nil {
		return nil, nil, err
	}
	if gid, err = read("gid_map"); err != nil {
		return nil, nil, err
	}
	// The process may have exited between the check and the reads, and its pid
	// been taken by another: the check again, after them.
	if err := unix.Stat(nsPath, &got); err != nil || got.Dev != want.Dev || got.Ino != want.Ino {
		return nil, nil, errors.Join(fmt.Errorf("%s left the network namespace's user namespace while its maps were read", proc), err)
	}
	return uid, gid, nil
}
