package wanterr

import (
	"errors"
	"testing"
)

// recorder notes the failures Mentions reports instead of failing the test.
type recorder struct {
	testing.TB
	errors, fatals int
}

func (r *recorder) Helper()               {}
func (r *recorder) Errorf(string, ...any) { r.errors++ }
func (r *recorder) Fatalf(string, ...any) { r.fatals++ }

func TestMentionsReportsEachMissingTextAndANilError(t *testing.T) {
	for _, tc := range []struct {
		name           string
		err            error
		want           []string
		errors, fatals int
	}{
		{"all there", errors.New(`PORT: "x" is not a port`), []string{"PORT", `"x"`}, 0, 0},
		{"one missing", errors.New(`PORT: "x" is not a port`), []string{"PORT", "ADDRESS"}, 1, 0},
		{"two missing", errors.New("refused"), []string{"PORT", "ADDRESS"}, 2, 0},
		{"no error", nil, []string{"PORT"}, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{TB: t}
			Mentions(r, tc.err, tc.want...)
			if r.errors != tc.errors || r.fatals != tc.fatals {
				t.Errorf("Mentions reported %d errors, %d fatals; want %d, %d", r.errors, r.fatals, tc.errors, tc.fatals)
			}
		})
	}
}
