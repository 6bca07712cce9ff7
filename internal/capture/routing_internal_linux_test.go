package capture

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

func TestOnLoReadsIfInet6(t *testing.T) {
	dir := t.TempDir()
	six := netip.MustParseAddr("::6")
	lines := "00000000000000000000000000000001 01 80 10 80       lo\n" +
		"fe80000000000000b0a2f8fffe3f2f1a 02 40 20 80     eth0\n"
	cases := []struct {
		name, content string
		missing, dir  bool
		want          bool
	}{
		{name: "no such file (IPv6 off at boot)", missing: true, want: false},
		{name: "empty", content: "", want: false},
		{name: "other addresses only", content: lines, want: false},
		{name: "on lo", content: lines + "00000000000000000000000000000006 01 80 10 80       lo\n", want: true},
		{name: "on another interface", content: lines + "00000000000000000000000000000006 02 80 00 80     eth0\n", want: false},
		{name: "unreadable: assume it is there", dir: true, want: true},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, string(rune('a'+i)))
			switch {
			case tc.dir:
				if err := os.Mkdir(p, 0o700); err != nil {
					t.Fatal(err)
				}
			case !tc.missing:
				if err := os.WriteFile(p, []byte(tc.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if got := onLo(p, six); got != tc.want {
				t.Errorf("onLo(::6) = %v, want %v", got, tc.want)
			}
		})
	}
}
