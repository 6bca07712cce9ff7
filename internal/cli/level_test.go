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
		{ParseOutputLevel, "debug", LevelDebug},
		{ParseOutputLevel, "default:warn", LevelWarn},
		{ParseOutputLevel, "cni:debug,default:warn", LevelWarn},
		{ParseOutputLevel, "default:warn,cni:debug", LevelWarn},
		{ParseOutputLevel, "error,cni:debug", LevelError},
		{ParseOutputLevel, "cni:debug", LevelDebug},
		{ParseOutputLevel, "cni:debug,install:error", LevelDebug},
		{ParseOutputLevel, "default:info,default:debug", LevelDebug},
		{ParseOutputLevel, " default:debug , ", LevelDebug},
		{ParseOutputLevel, "default:warning", LevelWarn},
	}
	for _, tc := range cases {
		got, err := tc.parse(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("parse %q = %q, %v; want %q", tc.in, got, err, tc.want)
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
