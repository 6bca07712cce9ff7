package settings

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Problems collects what is wrong with a set of settings, each naming its variable,
// so that all are reported at once rather than one per restart of the agent.
type Problems struct {
	errs []error
}

// Add records a problem with the variable name: "NAME: <format, args>".
func (p *Problems) Add(name, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("%s: %s", name, fmt.Sprintf(format, args...)))
}

// Err is every problem recorded, joined; nil when there is none.
func (p *Problems) Err() error { return errors.Join(p.errs...) }

// Reader sets fields from variables through lookup (os.LookupEnv in the agent); an
// unset variable keeps the field's default, and a value that does not parse is a
// Problem naming the variable and the value as given.
type Reader struct {
	Problems
	lookup func(string) (string, bool)
}

// NewReader reads through lookup.
func NewReader(lookup func(string) (string, bool)) *Reader {
	return &Reader{lookup: lookup}
}

// String sets *dst to the trimmed value whenever the variable is set: an empty
// value is a choice (for example "no selector").
func (r *Reader) String(name string, dst *string) {
	if v, ok := r.lookup(name); ok {
		*dst = strings.TrimSpace(v)
	}
}

// NonEmpty sets *dst to the trimmed value unless it is blank, which keeps the
// default: for settings that cannot be empty.
func (r *Reader) NonEmpty(name string, dst *string) {
	if v, ok := r.lookup(name); ok && strings.TrimSpace(v) != "" {
		*dst = strings.TrimSpace(v)
	}
}

// Bool parses the value as strconv.ParseBool does (true, false, 1, 0, ...).
func (r *Reader) Bool(name string, dst *bool) {
	parse(r, name, dst, strconv.ParseBool, "true or false")
}

// IstioSwitch parses one of Istio's install-cni switches (see IstioSwitch).
func (r *Reader) IstioSwitch(name string, dst *bool) {
	if v, ok := r.lookup(name); ok {
		b, err := IstioSwitch(v)
		if err != nil {
			r.Add(name, "%v", err)
			return
		}
		*dst = b
	}
}

// IstioSwitch reads a switch of Istio's install-cni as Istio's reads it, where its
// reading means something: strconv.ParseBool's forms (true, false, 1, 0, ...),
// and a value set but empty or blank is false (Istio's install-cni reads its
// variables through viper with AllowEmptyEnv, which takes an empty variable as
// set, and an empty switch as false, not as its default). Any other value is an
// error, where Istio's reads it as false without a word: "yes" or "on" asks for
// the opposite, and so does " true" (a word with spaces around it, which
// strconv.ParseBool does not take).
func IstioSwitch(v string) (bool, error) {
	t := strings.TrimSpace(v)
	if t == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	switch {
	case err == nil:
		return b, nil
	case t != v:
		if _, err := strconv.ParseBool(t); err == nil {
			return false, fmt.Errorf("%q has spaces around it, and Istio's install-cni reads it as false: write it without them", v)
		}
	}
	return false, fmt.Errorf("%q is not true or false", v)
}

// Int parses a decimal integer.
func (r *Reader) Int(name string, dst *int) {
	parse(r, name, dst, strconv.Atoi, "an integer")
}

// Duration parses a Go duration; example (like "15s") is shown in the error, so it
// should be a sensible value for this setting.
func (r *Reader) Duration(name string, dst *time.Duration, example string) {
	parse(r, name, dst, time.ParseDuration, "a duration (like "+example+")")
}

// parse sets *dst from the trimmed value when the variable is set; a value that
// does not parse leaves *dst alone and is reported as "NAME: "VALUE" is not <want>".
func parse[T any](r *Reader, name string, dst *T, from func(string) (T, error), want string) {
	if v, ok := r.lookup(name); ok {
		x, err := from(strings.TrimSpace(v))
		if err != nil {
			r.Add(name, "%q is not %s", v, want)
			return
		}
		*dst = x
	}
}

// CheckEnabled is what a controller's New checks first: that it is switched on
// (enabledEnv names the switch) and that its settings are valid. Errors start with
// component, like "repair controller".
func CheckEnabled(component, enabledEnv string, enabled bool, validate func() error) error {
	if !enabled {
		return fmt.Errorf("%s: %s is false", component, enabledEnv)
	}
	if err := validate(); err != nil {
		return fmt.Errorf("%s: %w", component, err)
	}
	return nil
}

// FromEnv reads a config from environment variables: read sets fields of a copy of
// def through a Reader on lookup, then the config validates itself. The Reader's
// problems (values that do not parse) come first, and alone.
func FromEnv[C interface{ Validate() error }](lookup func(string) (string, bool), def C, read func(r *Reader, c *C)) (C, error) {
	c := def
	r := NewReader(lookup)
	read(r, &c)
	var zero C
	if err := r.Err(); err != nil {
		return zero, err
	}
	if err := c.Validate(); err != nil {
		return zero, err
	}
	return c, nil
}
