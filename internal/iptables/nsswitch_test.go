package iptables

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOwnerLookupsAreLocalOnlyWithLocalSources: a node's user and group lookups
// stay on the machine only when every passwd and group source is a file or a
// local daemon's socket; one source that asks a server makes the restores mask
// nsswitch.conf.
func TestOwnerLookupsAreLocalOnlyWithLocalSources(t *testing.T) {
	for _, tc := range []struct {
		name string
		conf string // "" with missing: no file
		want bool
	}{
		{"Debian's default", "passwd:         files systemd\ngroup:          files systemd\nhosts:          files dns\n", true},
		{"compat", "passwd: compat\ngroup: compat\n", true},
		{"sssd", "passwd: files sss\n", true},
		{"winbind", "passwd: files winbind\n", true},
		{"Fedora CoreOS", "passwd: files altfiles systemd\n", true},
		{"actions between sources", "passwd: files [ NOTFOUND=return ] systemd\n", true},
		{"GKE with OS Login", "passwd: files cache_oslogin oslogin\ngroup: files cache_oslogin oslogin\n", false},
		{"ldap", "passwd: files ldap\n", false},
		{"nis", "passwd: files nis\n", false},
		{"one of two passwd lines asks a server", "passwd: files\npasswd: files ldap\n", false},
		{"hesiod", "passwd: files hesiod\n", false},
		{"groups from a server", "passwd: files\ngroup: files ldap\n", false},
		{"action hides no source", "passwd: files [NOTFOUND=return] ldap\n", false},
		{"a server for other databases only", "passwd: files\nhosts: files dns\nnetgroup: nis\nautomount: files ldap\n", true},
		{"commented out", "# passwd: files ldap\npasswd: files # ldap\n", true},
		{"no passwd line", "hosts: files dns\n", true},
		{"empty", "\n", true},
		{"over the bound", "passwd: files\n" + strings.Repeat("#\n", maxNsswitchBytes), false},
		{"missing", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "nsswitch.conf")
			if tc.conf != "" {
				if err := os.WriteFile(path, []byte(tc.conf), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if got := ownerLookupsLocal(path); got != tc.want {
				t.Errorf("ownerLookupsLocal(%q) = %v, want %v", tc.conf, got, tc.want)
			}
		})
	}
}
