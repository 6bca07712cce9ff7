package image

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Versions order as dpkg --compare-versions orders them (deb-version(5)).
func TestCompareVersions(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"1.0", "1.0", 0},
		{"1.0", "1.1", -1},
		{"1.10", "1.9", 1},
		{"1.0~rc1", "1.0", -1}, // a tilde sorts before the end
		{"1.0~rc1", "1.0~", 1}, // and before anything else
		{"1.0a", "1.0", 1},     // a letter after the end
		{"1.0a", "1.0+", -1},   // letters before other characters
		{"1:1.0", "2.0", 1},    // the epoch first
		{"0:1.0", "1.0", 0},    // epoch 0 is no epoch
		{"1.0-1", "1.0-2", -1}, // the revision last
		{"1.0-10", "1.0-9", 1}, // numerically
		{"1.0-1", "1.0", 1},    // a revision after none
		{"001.2", "1.2", 0},    // leading zeros do not count
		{"2.36-9+deb12u14", "2.36-9+deb12u7", 1},
		{"2.36-9+deb12u7", "2.36-9", 1},
		{"1.8.9-2", "1.8.9-2~bpo11+1", 1},
		{"2:6.2.1+dfsg1-1.1", "2:6.2.1+dfsg1-1", 1},
		{"3.1-20221030-2", "3.1-20130611-0", 1}, // the last hyphen splits the revision
	} {
		if got := compareVersions(tc.a, tc.b); got != tc.want {
			t.Errorf("compareVersions(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
		if got := compareVersions(tc.b, tc.a); got != -tc.want {
			t.Errorf("compareVersions(%q, %q) = %d, want %d", tc.b, tc.a, got, -tc.want)
		}
	}
}

func TestParseDepends(t *testing.T) {
	got, err := parseDepends("libc6 (>= 2.34), libfoo:any | bar (<< 2~) [amd64],\n baz (= 1:1.0-1)")
	if err != nil {
		t.Fatal(err)
	}
	want := [][]dependency{
		{{"libc6", ">=", "2.34"}},
		{{"libfoo", "", ""}, {"bar", "<<", "2~"}},
		{{"baz", "=", "1:1.0-1"}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	for _, bad := range []string{"libc6 (>= 2.34", "libc6 (~ 2)", "libc6 (>=)", "(>= 1)"} {
		if _, err := parseDepends(bad); err == nil {
			t.Errorf("parseDepends(%q): no error", bad)
		}
	}
}

func TestParseControl(t *testing.T) {
	got, err := parseControl(strings.NewReader("Package: a\nDescription: short\n long line\n .\n\n\nPackage: b\nVersion: 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []stanza{
		{{"Package", "a"}, {"Description", "short\n long line\n ."}},
		{{"Package", "b"}, {"Version", "1"}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if s := got[0].String(); s != "Package: a\nDescription: short\n long line\n .\n" {
		t.Errorf("written back as %q", s)
	}
	for _, bad := range []string{" continuation first\n", "Package: a\nno colon here\n", "Bad Name: x\n"} {
		if _, err := parseControl(strings.NewReader(bad)); err == nil {
			t.Errorf("parseControl(%q): no error", bad)
		}
	}
}

// indexOf builds a package index from Packages-format text.
func indexOf(t *testing.T, text string) *packageIndex {
	t.Helper()
	stanzas, err := parseControl(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	ix := newPackageIndex()
	if err := ix.add("http://mirror/debian", stanzas); err != nil {
		t.Fatal(err)
	}
	return ix
}

func resolvedNames(ps []*indexPackage) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name+"="+p.Version)
	}
	return out
}

// The resolver takes the closure under Depends and Pre-Depends: the newest version
// that meets a relation (across suites: the same name twice), the first
// alternative that exists, a provider for a virtual name, a package already chosen
// when it meets the relation, and nothing for an excluded name.
func TestResolveDebian(t *testing.T) {
	ix := indexOf(t, `Package: tool
Version: 1.0
Architecture: amd64
Pre-Depends: awk
Depends: libc6 (>= 2.34), missing | libalt, virtual-thing, libold (<< 2)

Package: libc6
Version: 2.36-9
Architecture: amd64
Depends: libgcc-s1

Package: libc6
Version: 2.36-9+deb12u7
Architecture: amd64
Depends: libgcc-s1

Package: libgcc-s1
Version: 12.2.0-14
Architecture: amd64
Depends: libc6 (>= 2.35)

Package: libalt
Version: 3
Architecture: all

Package: provider-b
Version: 1
Architecture: amd64
Provides: virtual-thing

Package: provider-a
Version: 1
Architecture: amd64
Provides: virtual-thing (= 1)

Package: libold
Version: 1.5
Architecture: amd64

Package: libold
Version: 2.0
Architecture: amd64

Package: unrelated
Version: 1
Architecture: amd64
`)
	got, err := resolveDebian(ix, []string{"tool"}, map[string]string{"awk": "scripts only"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"libalt=3", "libc6=2.36-9+deb12u7", "libgcc-s1=12.2.0-14", "libold=1.5", "provider-a=1", "tool=1.0"}
	if diff := cmp.Diff(want, resolvedNames(got)); diff != "" {
		t.Errorf("resolved (-want +got):\n%s", diff)
	}

	// What nothing meets is an error naming the chain.
	_, err = resolveDebian(ix, []string{"tool"}, nil)
	if err == nil || !strings.Contains(err.Error(), "tool -> tool Pre-Depends: nothing in the index meets [awk]") {
		t.Errorf("unmet awk: error %v", err)
	}
	bad := indexOf(t, "Package: a\nVersion: 1\nDepends: b (>= 2)\n\nPackage: b\nVersion: 1\n")
	if _, err := resolveDebian(bad, []string{"a"}, nil); err == nil || !strings.Contains(err.Error(), "b (>= 2)") {
		t.Errorf("too old a dependency: error %v", err)
	}
	if _, err := resolveDebian(bad, []string{"nope"}, nil); err == nil || !strings.Contains(err.Error(), "root package nope") {
		t.Errorf("unknown root: error %v", err)
	}
}

// The lock is the resolver's answer on the locked packages' own metadata: resolving
// DebianRoots over the control files of the .debs the lock pins (downloaded or
// cached) gives exactly the locked set for each architecture, so the lock is
// closed under dependencies and holds nothing more.
func TestDebianLockIsTheClosureOfItsRoots(t *testing.T) {
	lock, err := LoadDebianLock()
	if err != nil {
		t.Fatal(err)
	}
	for _, arch := range DebianArches {
		ix := newPackageIndex()
		var want []string
		for _, lp := range lock.Packages[arch] {
			file, err := FetchDeb(t.Context(), lp)
			if err != nil {
				t.Fatal(err)
			}
			p, err := readDeb(file)
			if err != nil {
				t.Fatal(err)
			}
			if err := ix.add(lp.URL, []stanza{p.Control}); err != nil {
				t.Fatal(err)
			}
			want = append(want, lp.Name+"="+lp.Version)
		}
		got, err := resolveDebian(ix, DebianRoots, DebianExcluded)
		if err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
		if diff := cmp.Diff(want, resolvedNames(got)); diff != "" {
			t.Errorf("%s: locked packages (-locked +closure of the roots):\n%s", arch, diff)
		}
	}
}

// A lock that does not match what the code asks for, or is incomplete, is refused
// with a message naming what is wrong.
func TestDebianLockIsChecked(t *testing.T) {
	good := string(debianLockJSON)
	if _, err := parseDebianLock([]byte(good)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, from, to, want string }{
		{"another root", `"nftables"`, `"nftables-extra"`, "written for roots"},
		{"bad digest", `"sha256": "`, `"sha256": "zz`, "is not 64 hex digits"},
		{"unknown field", `"distro":`, `"distribution": "x", "distro":`, "unknown field"},
		{"wrong arch", `"arch": "arm64"`, `"arch": "riscv64"`, "architecture \"riscv64\""},
	} {
		bad := strings.Replace(good, tc.from, tc.to, 1)
		if bad == good {
			t.Fatalf("%s: %q not in the lock", tc.name, tc.from)
		}
		if _, err := parseDebianLock([]byte(bad)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

// Documentation, manual pages and translations are left out, the copyright files
// kept; /bin, /sbin and /lib* paths land under /usr.
func TestDroppedAndMergedUsr(t *testing.T) {
	checkEach(t, "dropped", dropped, map[string]bool{
		"/usr/share/doc/iptables/copyright":                   false,
		"/usr/share/doc/iptables":                             false,
		"/usr/share/doc/iptables/changelog.Debian.gz":         true,
		"/usr/share/man/man8/iptables.8.gz":                   true,
		"/usr/share/locale/de/LC_MESSAGES/libc.mo":            true,
		"/usr/lib/x86_64-linux-gnu/gconv/UTF-16.so":           true,
		"/usr/lib/x86_64-linux-gnu/xtables/libxt_owner.so":    false,
		"/usr/share/iptables/iptables.xslt":                   false,
		"/usr/share/doc-base/something":                       false,
		"/usr/lib/aarch64-linux-gnu/gconv/gconv-modules.d/xx": true,
	})
	checkEach(t, "mergedUsr", mergedUsr, map[string]string{
		"/lib/x86_64-linux-gnu/libc.so.6": "/usr/lib/x86_64-linux-gnu/libc.so.6",
		"/lib64/ld-linux-x86-64.so.2":     "/usr/lib64/ld-linux-x86-64.so.2",
		"/sbin/x":                         "/usr/sbin/x",
		"/libexec/x":                      "/libexec/x",
		"/etc/protocols":                  "/etc/protocols",
		"/lib":                            "/usr/lib",
	})
}
