package agent

import (
	"errors"
	"fmt"
	"testing"

	"github.com/istio-cni/istio-cni/internal/cniconf"
)

// An edit of a CNI config (install or uninstall) that found the file changed under
// it is tried again, each try reading the file anew, up to ChangedTries times;
// any other failure ends it at once.
func TestWhileChangedTriesAChangedFileAgain(t *testing.T) {
	changed := fmt.Errorf("10-pods.conflist: %w", cniconf.ErrChanged)
	other := errors.New("read-only file system")
	for _, tc := range []struct {
		name      string
		results   []error // what each try returns; past the end, success
		wantCalls int
		wantErr   error
	}{
		{"first try", nil, 1, nil},
		{"changed twice", []error{changed, changed}, 3, nil},
		{"changed at every try", []error{changed, changed, changed, changed, changed}, ChangedTries, cniconf.ErrChanged},
		{"another failure", []error{other, changed}, 1, other},
		{"changed, then another failure", []error{changed, other}, 2, other},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			err := whileChanged(func() error {
				calls++
				if calls <= len(tc.results) {
					return tc.results[calls-1]
				}
				return nil
			})
			if calls != tc.wantCalls {
				t.Errorf("%d tries, want %d", calls, tc.wantCalls)
			}
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Errorf("error %v, want %v", err, tc.wantErr)
			}
		})
	}
}
