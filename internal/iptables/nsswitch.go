package iptables

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"strings"
	"sync"
)

// nsswitchConf is the file glibc's NSS reads for its sources. iptables-restore
// asks them for every owner match it parses: libxt_owner calls getpwnam on
// --uid-owner's argument (getgrnam on --gid-owner's) before it reads it as a
// number, in the pod's network namespace.
const nsswitchConf = "/etc/nsswitch.conf"

// maxNsswitchBytes bounds the read of nsswitch.conf: a real one is a few hundred
// bytes. A larger file is not read to its end and counts as not local.
const maxNsswitchBytes = 64 << 10

// localOwnerSources are the passwd and group sources that answer without the
// network: from files, or from a daemon or bus reached over a unix socket, which
// a network namespace does not cut off (the daemon asks its servers from its
// own).
var localOwnerSources = map[string]bool{
	"files":         true, // /etc/passwd, /etc/group
	"compat":        true, // the same files; only their +/- lines ask NIS, unseen on nodes
	"db":            true, // /var/lib/misc/{passwd,group}.db
	"systemd":       true, // systemd's dynamic users and userdb, over unix sockets
	"mymachines":    true, // systemd-machined's containers, over D-Bus
	"sss":           true, // sssd's socket; sssd asks LDAP or AD itself
	"winbind":       true, // winbindd's socket; winbindd asks AD itself
	"extrausers":    true, // /var/lib/extrausers (Ubuntu Core)
	"cache_oslogin": true, // GCE OS Login's /etc/oslogin_{passwd,group}.cache
	"altfiles":      true, // /usr/lib/{passwd,group} (Fedora CoreOS, RHCOS)
	"usrfiles":      true, // /usr/etc/{passwd,group} (openSUSE MicroOS)
}

// nssIsLocal says, once per process, whether the user and group lookups of this
// process's tools stay on the machine (ownerLookupsLocal of nsswitch.conf).
// When they may not, restores run with nsswitch.conf masked (see restore).
var nssIsLocal = sync.OnceValue(func() bool { return ownerLookupsLocal(nsswitchConf) })

// ownerLookupsLocal says whether every passwd and group source the
// nsswitch.conf at path names is one of localOwnerSources. Not local: a source
// that asks a server from the caller's network namespace (GKE's OS Login:
// "files cache_oslogin oslogin", asking the metadata server; nis, ldap,
// hesiod), which from a pod's half set-up namespace stalls or fails the lookup,
// and with it the ADD (Istio's istio/istio#48416). A missing file or line is
// glibc's default, files. Every passwd and group line counts (glibc releases
// differ on which of two wins), and a file that cannot be read whole counts as
// not local.
func ownerLookupsLocal(path string) bool {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return true
	}
	if err != nil {
		return false
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxNsswitchBytes+1))
	if err != nil || len(data) > maxNsswitchBytes {
		return false
	}
	for _, line := range bytes.Split(data, []byte("\n")) {
		line, _, _ = bytes.Cut(line, []byte("#"))
		db, sources, ok := strings.Cut(string(line), ":")
		db = strings.TrimSpace(db)
		if !ok || !strings.EqualFold(db, "passwd") && !strings.EqualFold(db, "group") {
			continue
		}
		for _, s := range strings.Fields(withoutActions(sources)) {
			if !localOwnerSources[s] {
				return false
			}
		}
	}
	return true
}

// withoutActions drops a source list's [STATUS=action] items, whose brackets may
// hold spaces.
func withoutActions(sources string) string {
	var b strings.Builder
	depth := 0
	for _, r := range sources {
		switch {
		case r == '[':
			depth++
			b.WriteByte(' ')
		case r == ']' && depth > 0:
			depth--
		case depth == 0:
			b.WriteRune(r)
		}
	}
	return b.String()
}
