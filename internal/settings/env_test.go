package settings

import (
	"errors"
	"testing"
	"time"
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
