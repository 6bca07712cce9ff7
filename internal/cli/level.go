package cli

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// Level is a log level by Istio's name. The plugin's config, install-cni and
// istio-iptables all read levels through ParseLevel or ParseOutputLevel, so every
// binary accepts the same names and maps them to slog the same way.
type Level string

// Istio's log levels, from the most to the least verbose.
const (
	LevelDebug Level = "debug"
	LevelInfo  Level = "info"
	LevelWarn  Level = "warn"
	LevelError Level = "error"
	LevelFatal Level = "fatal"
	LevelPanic Level = "panic"
	LevelNone  Level = "none"
)

// Levels are the level names ParseLevel accepts (besides "warning"), from the most
// to the least verbose.
var Levels = []Level{LevelDebug, LevelInfo, LevelWarn, LevelError, LevelFatal, LevelPanic, LevelNone}

// ParseLevel reads one of Istio's level names, in any case and with surrounding
// space; "warning" is "warn".
func ParseLevel(s string) (Level, error) {
	name := strings.ToLower(strings.TrimSpace(s))
	if name == "warning" {
		return LevelWarn, nil
	}
	for _, l := range Levels {
		if Level(name) == l {
			return l, nil
		}
	}
	return "", fmt.Errorf("%s is not a log level (%s)", redirect.Quote(s), levelNames())
}

func levelNames() string {
	names := make([]string, len(Levels))
	for i, l := range Levels {
		names[i] = string(l)
	}
	return strings.Join(names, ", ")
}

// ParseOutputLevel reads Istio's --log_output_level: a level, or comma-separated
// "scope:level" pairs where a bare level is the "default" scope's. A command here
// has a single log, so the "default" scope's level counts (the last one given);
// without one, the first scope given counts, so that "cni:debug" means debug.
// Scopes named in others belong to another program's log (the agent passes
// "cni-plugin", the plugin's scope: see ScopeLevel) and never count; a value that
// names only those leaves the command at info. Every level must be a valid name,
// including those of scopes that do not count.
func ParseOutputLevel(s string, others ...string) (Level, error) {
	var def, first Level
	named := false
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		scope, name, scoped := strings.Cut(item, ":")
		if !scoped {
			scope, name = "default", item
		}
		scope = strings.TrimSpace(scope)
		l, err := ParseLevel(name)
		if err != nil {
			return "", outputLevelError(s)
		}
		named = true
		switch {
		case scope == "default":
			def = l
		case slices.Contains(others, scope):
		case first == "":
			first = l
		}
	}
	switch {
	case def != "":
		return def, nil
	case first != "":
		return first, nil
	case named:
		return LevelInfo, nil
	}
	return "", outputLevelError(s)
}

// ScopeLevel is the level a --log_output_level value s gives scope, as Istio's
// logging reads it: the last "scope:level" for it, or "all:level", which sets every
// scope; ok is false when s names neither (a bare level is the "default" scope's
// only). s must have passed ParseOutputLevel.
func ScopeLevel(s, scope string) (l Level, ok bool) {
	for _, item := range strings.Split(s, ",") {
		sc, name, scoped := strings.Cut(strings.TrimSpace(item), ":")
		if sc = strings.TrimSpace(sc); !scoped || (sc != scope && sc != "all") {
			continue
		}
		if parsed, err := ParseLevel(name); err == nil {
			l, ok = parsed, true
		}
	}
	return l, ok
}

func outputLevelError(s string) error {
	return fmt.Errorf("%s is not a log level (%s) or a list of scope:level", redirect.Quote(s), levelNames())
}

// Slog maps the level to slog's scale: fatal and panic let only graver records
// through than error does, and none lets nothing through. An unknown level is info.
func (l Level) Slog() slog.Level {
	switch l {
	case LevelDebug:
		return slog.LevelDebug
	case LevelWarn:
		return slog.LevelWarn
	case LevelError:
		return slog.LevelError
	case LevelFatal:
		return slog.LevelError + 4
	case LevelPanic:
		return slog.LevelError + 8
	case LevelNone:
		return slog.LevelError + 100
	}
	return slog.LevelInfo
}
