package settings

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// Setting is one setting of a T: a flag, and the environment variables that give it
// when the flag is absent.
type Setting[T any] struct {
	// Name is the flag's name without "--"; empty for a setting read only from Envs.
	Name string
	// Short is the one-letter form of the flag ("p" for -p), if any.
	Short string
	// Envs are the variables read when the flag is absent; of several that are set,
	// the last one listed wins.
	Envs []string
	// Bool makes the flag a switch: --x alone means --x=true.
	Bool bool
	// Default is shown in --help and, when the Table's SetDefaults is on, passed to
	// Set when neither the flag nor a variable gives a value. An environment-only
	// setting's --help line is its Usage alone, which should say its default.
	Default string
	Usage   string
	// Hidden leaves the flag out of --help; it is still accepted.
	Hidden bool
	// EmptyIsValue passes a variable that is set but empty or blank to Set, for a
	// setting whose empty value means something other than its default (Istio's
	// ISTIO_OUTBOUND_OWNER_GROUPS: empty captures no group, unset every group).
	// Without it such a variable counts as unset.
	EmptyIsValue bool
	// Set parses a value into the config. Its error says what is wrong with the
	// value; Parse prefixes it with where the value came from.
	Set func(*T, string) error
}

// flag is how errors name the setting: "--name", "-n/--name", or for an
// environment-only setting its variables.
func (s Setting[T]) flag() string {
	switch {
	case s.Name == "":
		return strings.Join(s.Envs, ", ")
	case s.Short != "":
		return "-" + s.Short + "/--" + s.Name
	}
	return "--" + s.Name
}

// fromEnv is the value of the last of s.Envs that is set and not blank (or, with
// EmptyIsValue, set).
func (s Setting[T]) fromEnv(lookupEnv func(string) (string, bool)) (value, env string, ok bool) {
	for i := len(s.Envs) - 1; i >= 0; i-- {
		if v, ok := lookupEnv(s.Envs[i]); ok && (s.EmptyIsValue || strings.TrimSpace(v) != "") {
			return v, s.Envs[i], true
		}
	}
	return "", "", false
}

// Table is a command's settings, in --help order.
type Table[T any] struct {
	// Command is the command's name, in messages.
	Command string
	// SetDefaults passes each setting's Default to its Set when neither the flag nor
	// a variable gives a value; an error then names "default of --x". Without it
	// such a setting is left alone: the caller passes Parse a T holding its defaults,
	// and Default is only shown in --help.
	SetDefaults bool
	// MaxValueBytes, when not 0, bounds every value the table reads (a flag's, a
	// variable's, a default): a longer one is refused before its Set parses it,
	// with an error that names the setting and the value's length, not the value.
	MaxValueBytes int
	Settings      []Setting[T]
}

// ErrHelp is what Parse returns for -h and --help.
var ErrHelp = pflag.ErrHelp

// FlagSet is a pflag set of the table's flags, in table order, that prints
// nothing: Parse and the command report errors and usage themselves.
func (t Table[T]) FlagSet() *pflag.FlagSet {
	fs := pflag.NewFlagSet(t.Command, pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.SortFlags = false
	for _, s := range t.Settings {
		if s.Name == "" {
			continue
		}
		usage := s.Usage
		if len(s.Envs) > 0 {
			usage += " (env " + strings.Join(s.Envs, ", ") + ")"
		}
		if s.Bool {
			def, _ := strconv.ParseBool(s.Default)
			fs.BoolP(s.Name, s.Short, def, usage)
		} else {
			fs.StringP(s.Name, s.Short, s.Default, usage)
		}
		if s.Hidden {
			_ = fs.MarkHidden(s.Name)
		}
	}
	return fs
}

// FlagUsages is the --help lines of the flags, one a flag (its variables and default
// included), in table order.
func (t Table[T]) FlagUsages() string { return t.FlagSet().FlagUsages() }

// EnvUsages is the --help lines of the environment-only settings: each variable
// and its Usage, in columns.
func (t Table[T]) EnvUsages() string {
	width := 0
	for _, s := range t.Settings {
		if s.Name == "" && !s.Hidden {
			width = max(width, len(s.flag()))
		}
	}
	var b strings.Builder
	for _, s := range t.Settings {
		if s.Name == "" && !s.Hidden {
			fmt.Fprintf(&b, "  %-*s  %s\n", width, s.flag(), s.Usage)
		}
	}
	return b.String()
}

// Parse applies the command-line arguments and the environment (looked up with
// lookupEnv) to dst: each setting's flag when given, else the last of its
// variables that is set and not blank (set, with EmptyIsValue), else its Default
// when SetDefaults is on.
// It reports every bad value at once, as "invalid flag --x: ..." or "invalid
// environment variable X: ...", and ErrHelp for -h and --help.
func (t Table[T]) Parse(dst *T, args []string, lookupEnv func(string) (string, bool)) error {
	fs := t.FlagSet()
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return ErrHelp
		}
		if bad := (*pflag.InvalidValueError)(nil); errors.As(err, &bad) {
			err = t.invalidValue(bad)
		}
		return fmt.Errorf("%w (see --help)", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %s: %s takes only flags (see --help)", redirect.Quote(fs.Arg(0)), t.Command)
	}
	var errs []error
	for _, s := range t.Settings {
		var value, source string
		if s.Name != "" && fs.Changed(s.Name) {
			value, source = fs.Lookup(s.Name).Value.String(), "flag "+s.flag()
		} else if v, env, ok := s.fromEnv(lookupEnv); ok {
			value, source = v, "environment variable "+env
		} else if t.SetDefaults {
			value, source = s.Default, "default of "+s.flag()
		} else {
			continue
		}
		if err := t.checkLength(value); err != nil {
			errs = append(errs, fmt.Errorf("invalid %s: %w", source, err))
			continue
		}
		if err := s.Set(dst, value); err != nil {
			errs = append(errs, fmt.Errorf("invalid %s: %w", source, err))
		}
	}
	return errors.Join(errs...)
}

// checkLength refuses a value longer than MaxValueBytes.
func (t Table[T]) checkLength(value string) error {
	if t.MaxValueBytes > 0 && len(value) > t.MaxValueBytes {
		return fmt.Errorf("a value of %d bytes, longer than the limit of %d", len(value), t.MaxValueBytes)
	}
	return nil
}

// invalidValue is pflag's error for a value its flag cannot hold (a switch given a
// word other than true or false), with the value quoted by redirect.Quote (a long
// one by its first bytes and its length), or over MaxValueBytes its length alone.
func (t Table[T]) invalidValue(bad *pflag.InvalidValueError) error {
	f := bad.GetFlag()
	if err := t.checkLength(bad.GetValue()); err != nil {
		for _, s := range t.Settings {
			if s.Name == f.Name {
				return fmt.Errorf("invalid flag %s: %w", s.flag(), err)
			}
		}
	}
	name := "--" + f.Name
	if f.Shorthand != "" && f.ShorthandDeprecated == "" {
		name = "-" + f.Shorthand + ", " + name
	}
	return fmt.Errorf("invalid argument %s for %q flag: %w", redirect.Quote(bad.GetValue()), name, errors.Unwrap(bad))
}

// Lookup is the value the setting named name takes from its flag in args or from
// one of its variables (set and not blank), where it takes it from ("flag --x" or
// "environment variable X", as Parse's errors name it), and whether it takes one
// from there rather than from its Default: for a command where one setting may
// stand in for another that is not given, or must agree with what is given.
// Parse reports any error in args; here they only make the flag count as not
// given.
func (t Table[T]) Lookup(name string, args []string, lookupEnv func(string) (string, bool)) (value, source string, ok bool) {
	fs := t.FlagSet()
	fs.SetOutput(io.Discard)
	flagOK := fs.Parse(args) == nil
	for _, s := range t.Settings {
		if s.Name != name {
			continue
		}
		if flagOK && fs.Changed(name) {
			return fs.Lookup(name).Value.String(), "flag " + s.flag(), true
		}
		v, env, ok := s.fromEnv(lookupEnv)
		if !ok {
			return "", "", false
		}
		return v, "environment variable " + env, true
	}
	return "", "", false
}

// Field is a Set that parses the value with parse and stores the result in the
// field of T that field points to.
func Field[T, V any](field func(*T) *V, parse func(string) (V, error)) func(*T, string) error {
	return func(t *T, v string) error {
		x, err := parse(v)
		if err != nil {
			return err
		}
		*field(t) = x
		return nil
	}
}
