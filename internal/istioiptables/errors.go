package istioiptables

import (
	"errors"
	"fmt"
	"strings"
)

// ExitNotRedirected is the exit status of a validation that found the pod's traffic
// not redirected: Istio's ValidationErrorCode, which its tooling (and istio-cni's
// repair controller) recognises.
const ExitNotRedirected = 126

// NotRedirectedError is the result of a validation whose probe was not redirected
// to the proxy.
type NotRedirectedError struct {
	// Failures says, per probe, what happened instead.
	Failures []string
	// Hint is a likely cause beyond the usual one, or empty.
	Hint string
}

func (e *NotRedirectedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "traffic is not being redirected to the proxy: %s.\n", strings.Join(e.Failures, "; "))
	b.WriteString("Most likely the pod's network namespace lacks Istio's capture rules. With istio-cni this happens when the pod " +
		"was started on a node where the istio-cni node agent was not installed or not ready yet. " +
		"Delete the pod so that it is created again once istio-cni is ready on its node " +
		"(istio-cni's repair controller does this itself when cni.repair.deletePods=true).")
	if e.Hint != "" {
		b.WriteString("\n" + e.Hint)
	}
	return b.String()
}

// ExitCode is the exit status for the result of Run: 0, 126 when validation found
// traffic not redirected, 1 for every other error.
func ExitCode(err error) int {
	var nr *NotRedirectedError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &nr):
		return ExitNotRedirected
	}
	return 1
}
