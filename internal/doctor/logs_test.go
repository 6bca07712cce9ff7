package doctor

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLogsGolden reads a sample of the plugin's log file (the records
// internal/plugin writes, a truncated last line as a crash leaves it) with each
// filter and format.
func TestLogsGolden(t *testing.T) {
	sample := filepath.Join("testdata", "logs", "istio-cni.log")
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"default.txt", nil},
		{"pod.txt", []string{"--pod", "app/web"}},
		{"since.txt", []string{"--since", "2026-03-01T10:02:00Z"}},
		{"all.txt", []string{"--all"}},
		{"default.json", []string{"-o", "json"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := Main(append([]string{"logs", "--log-file", sample}, tc.args...), nil, &stdout, &stderr)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			if !strings.Contains(stderr.String(), "1 lines of") {
				t.Errorf("stderr %q does not report the truncated line", stderr.String())
			}
			checkGolden(t, filepath.Join("testdata", "logs", tc.name+".golden"), stdout.String())
		})
	}
}

func TestLogsErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"logs", "--log-file", filepath.Join(t.TempDir(), "none.log")}, 1, "the plugin has not run here"},
		{[]string{"logs", "--since", "yesterday"}, 2, `want a duration (1h, 30m) or an RFC 3339 time`},
		{[]string{"logs", "--pod", "web"}, 2, "want NAMESPACE/POD"},
		{[]string{"logs", "-o", "yaml"}, 2, `-o "yaml"`},
	} {
		var stdout, stderr bytes.Buffer
		if code := Main(tc.args, nil, &stdout, &stderr); code != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", tc.args, code, stderr.String(), tc.code, tc.want)
		}
	}
}

func TestParseSince(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"":                     {},
		"90m":                  now.Add(-90 * time.Minute),
		"2026-03-01T10:00:00Z": time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC),
	} {
		got, err := ParseSince(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("ParseSince(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseSince("-1h", now); err == nil {
		t.Error("negative duration accepted")
	}
}
