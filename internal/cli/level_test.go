package cli

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseLevelErrorQuotesTheValueAndListsTheNames(t *testing.T) {
	for _, in := range []string{"", "loud", "trace", "default:info"} {
		_, err := ParseLevel(in)
		want := `"` + in + `" is not a log level (debug, info, warn, error, fatal, panic, none)`
		if err == nil || err.Error() != want {
			t.Errorf("ParseLevel(%q) error = %v, want %s", in, err, want)
		}
	}
}

func TestParseLevelAndParseOutputLevelReadIstioForms(t *testing.T) {
	cases := []struct {
		parse func(string) (Level, error)
		in    string
		want  Level
	}{
		{ParseLevel, "debug", LevelDebug},
		{ParseLevel, " INFO ", LevelInfo},
		{ParseLevel, "warn", LevelWarn},
		{ParseLevel, "Warning", LevelWarn},
		{ParseLevel, "error", LevelError},
		{ParseLevel, "fatal", LevelFatal},
		{ParseLevel, "panic", LevelPanic},
		{ParseLevel, "none", LevelNone},
		{parseOutputLevel, "debug", LevelDebug},
		{parseOutputLevel, "default:warn", LevelWarn},
		{parseOutputLevel, "cni:debug,default:warn", LevelWarn},
		{parseOutputLevel, "default:warn,cni:debug", LevelWarn},
		{parseOutputLevel, "error,cni:debug", LevelError},
		{parseOutputLevel, "cni:debug", LevelDebug},
		{parseOutputLevel, "cni:debug,install:error", LevelDebug},
		{parseOutputLevel, "default:info,default:debug", LevelDebug},
		{parseOutputLevel, " default:debug , ", LevelDebug},
		{parseOutputLevel, "default:warning", LevelWarn},
	}
	for _, tc := range cases {
		got, err := tc.parse(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("parse %q = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func parseOutputLevel(s string) (Level, error) { return ParseOutputLevel(s) }

// TestOtherProgramsScopes: a scope named as another program's never sets the
// command's level; a value naming only such scopes leaves it at info; ScopeLevel
// reads a scope's own level or all's, the last one given.
func TestOtherProgramsScopes(t *testing.T) {
	for in, want := range map[string]Level{
		"cni-plugin:debug":                  LevelInfo,
		"cni-plugin:debug,cni-agent:warn":   LevelWarn,
		"default:error,cni-plugin:debug":    LevelError,
		"cni-plugin:debug,all:warn":         LevelWarn,
		"cni-plugin:debug , default:debug,": LevelDebug,
	} {
		if got, err := ParseOutputLevel(in, "cni-plugin"); err != nil || got != want {
			t.Errorf("ParseOutputLevel(%q, cni-plugin) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseOutputLevel("cni-plugin:loud", "cni-plugin"); err == nil {
		t.Errorf("a bad level of another program's scope was accepted")
	}
	type scoped struct {
		l  Level
		ok bool
	}
	for in, want := range map[string]scoped{
		"default:info,cni-plugin:debug": {LevelDebug, true},
		"all:warn":                      {LevelWarn, true},
		"cni-plugin:debug,all:error":    {LevelError, true},
		"all:error, cni-plugin : debug": {LevelDebug, true},
		"debug":                         {"", false},
		"default:debug,cni-agent:debug": {"", false},
	} {
		l, ok := ScopeLevel(in, "cni-plugin")
		if (scoped{l, ok}) != want {
			t.Errorf("ScopeLevel(%q, cni-plugin) = %q, %v; want %q, %v", in, l, ok, want.l, want.ok)
		}
	}
}

func TestParseOutputLevelRejectsAnyBadLevel(t *testing.T) {
	for _, in := range []string{"", " , ", "chatty", "default:loud", "cni:loud,default:info", "default"} {
		_, err := ParseOutputLevel(in)
		if err == nil || !strings.Contains(err.Error(), `"`+in+`" is not a log level`) {
			t.Errorf("ParseOutputLevel(%q) error = %v, want one quoting the value", in, err)
		}
	}
}

func TestLevelsMapToIncreasingSlogLevels(t *testing.T) {
	for i := 1; i < len(Levels); i++ {
		if Levels[i-1].Slog() >= Levels[i].Slog() {
			t.Errorf("%s (%v) not below %s (%v)", Levels[i-1], Levels[i-1].Slog(), Levels[i], Levels[i].Slog())
		}
	}
	got := map[Level]string{}
	for _, l := range []Level{LevelDebug, LevelInfo, LevelWarn, LevelError} {
		got[l] = l.Slog().String()
	}
	want := map[Level]string{LevelDebug: "DEBUG", LevelInfo: "INFO", LevelWarn: "WARN", LevelError: "ERROR"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("slog levels (-want +got):\n%s", diff)
	}
}
