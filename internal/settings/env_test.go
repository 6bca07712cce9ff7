package settings

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestReaderKeepsDefaultsAndNamesEveryBadValue(t *testing.T) {
	env := map[string]string{
		"S": "  v  ", "EMPTY": " ", "B": "yes", "I": "1x", "D": "3", "OK_B": "false", "OK_D": "2s",
	}
	r := NewReader(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	s, empty, kept, unset := "def", "def", "def", "def"
	b, okB := true, true
	i, d, okD := 7, time.Second, time.Second
	r.String("S", &s)
	r.String("EMPTY", &empty)
	r.NonEmpty("EMPTY", &kept)
	r.NonEmpty("UNSET", &unset)
	r.Bool("B", &b)
	r.Bool("OK_B", &okB)
	r.Int("I", &i)
	r.Duration("D", &d, "15s")
	r.Duration("OK_D", &okD, "15s")
	if s != "v" || empty != "" || kept != "def" || unset != "def" || !b || okB || i != 7 || d != time.Second || okD != 2*time.Second {
		t.Errorf("got s=%q empty=%q kept=%q unset=%q b=%v okB=%v i=%d d=%v okD=%v", s, empty, kept, unset, b, okB, i, d, okD)
	}
	want := `B: "yes" is not true or false` + "\n" + `I: "1x" is not an integer` + "\n" + `D: "3" is not a duration (like 15s)`
	if err := r.Err(); err == nil || err.Error() != want {
		t.Errorf("errors:\n%v\nwant:\n%s", err, want)
	}
}

func TestCheckEnabled(t *testing.T) {
	bad := errors.New("X: wrong")
	if err := CheckEnabled("c", "ON", false, func() error { return nil }); err == nil || err.Error() != "c: ON is false" {
		t.Errorf("disabled: %v", err)
	}
	if err := CheckEnabled("c", "ON", true, func() error { return bad }); !errors.Is(err, bad) || err.Error() != "c: X: wrong" {
		t.Errorf("invalid: %v", err)
	}
	if err := CheckEnabled("c", "ON", true, func() error { return nil }); err != nil {
		t.Errorf("valid: %v", err)
	}
}

type portConfig struct{ Port int }

func (c portConfig) Validate() error {
	if c.Port < 1 {
		return fmt.Errorf("PORT: %d is not a port", c.Port)
	}
	return nil
}

func TestFromEnvReadsOverTheDefaultThenValidates(t *testing.T) {
	read := func(r *Reader, c *portConfig) { r.Int("PORT", &c.Port) }
	cases := []struct {
		name    string
		env     map[string]string
		want    portConfig
		wantErr string
	}{
		{name: "unset keeps the default", want: portConfig{Port: 80}},
		{name: "set", env: map[string]string{"PORT": " 8080 "}, want: portConfig{Port: 8080}},
		{name: "a value that does not parse is reported before validation", env: map[string]string{"PORT": "x"},
			wantErr: `PORT: "x" is not an integer`},
		{name: "an invalid value", env: map[string]string{"PORT": "0"}, wantErr: "PORT: 0 is not a port"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FromEnv(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }, portConfig{Port: 80}, read)
			if gotErr := fmt.Sprint(err); err != nil || tc.wantErr != "" {
				if gotErr != tc.wantErr {
					t.Fatalf("error %q, want %q", gotErr, tc.wantErr)
				}
				return
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}

// TestIstioSwitchReadsAsIstiosInstallCNI: Istio's install-cni (viper with
// AllowEmptyEnv) reads a switch set but empty as false; a word it would read as
// false without a word is refused here.
func TestIstioSwitchReadsAsIstiosInstallCNI(t *testing.T) {
	for _, tc := range []struct {
		v       string
		want    bool
		wantErr string
	}{
		{v: "", want: false},
		{v: "  ", want: false},
		{v: "true", want: true},
		{v: "TRUE", want: true},
		{v: "1", want: true},
		{v: "false", want: false},
		{v: "0", want: false},
		{v: "yes", wantErr: `"yes" is not true or false`},
		{v: "on ", wantErr: `"on " is not true or false`},
		// Istio's reads these as false, whatever they say.
		{v: " true", wantErr: `" true" has spaces around it, and Istio's install-cni reads it as false: write it without them`},
		{v: "false\n", wantErr: `"false\n" has spaces around it, and Istio's install-cni reads it as false: write it without them`},
	} {
		got, err := IstioSwitch(tc.v)
		if gotErr := fmt.Sprint(err); (err != nil || tc.wantErr != "") && gotErr != tc.wantErr {
			t.Errorf("IstioSwitch(%q): error %q, want %q", tc.v, gotErr, tc.wantErr)
			continue
		}
		if got != tc.want {
			t.Errorf("IstioSwitch(%q) = %t, want %t", tc.v, got, tc.want)
		}
	}
	env := map[string]string{"EMPTY": "", "ON": "true", "BAD": "sure"}
	r := NewReader(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	empty, on, bad, unset := true, false, true, true
	r.IstioSwitch("EMPTY", &empty)
	r.IstioSwitch("ON", &on)
	r.IstioSwitch("BAD", &bad)
	r.IstioSwitch("UNSET", &unset)
	if empty || !on || !bad || !unset {
		t.Errorf("empty %t on %t bad %t unset %t; want false true true (kept) true (default)", empty, on, bad, unset)
	}
	if err := r.Err(); err == nil || err.Error() != `BAD: "sure" is not true or false` {
		t.Errorf("errors: %v", err)
	}
}
