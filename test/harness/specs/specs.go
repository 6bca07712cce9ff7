// Package specs writes capture specs for test tables in Istio's string forms, through
// the product's own parsing (redirect.Spec.Set) and validation.
package specs

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// Settings are capture fields in the string forms of Istio's flags and annotations.
type Settings map[redirect.Field]string

// Spec applies the settings in field order onto redirect.DefaultSpec and validates.
// As in Istio, the proxy gids default to the proxy uids when only uids are given.
func (s Settings) Spec() (redirect.Spec, error) {
	spec := redirect.DefaultSpec()
	var errs []error
	for _, f := range redirect.Fields() {
		if v, ok := s[f]; ok {
			if err := spec.Set(f, v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", f, err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return redirect.Spec{}, err
	}
	if _, uids := s[redirect.FieldProxyUIDs]; uids {
		if _, gids := s[redirect.FieldProxyGIDs]; !gids {
			spec.ProxyGIDs = slices.Clone(spec.ProxyUIDs)
		}
	}
	return spec, spec.Validate()
}

// Sidecar is what Istio's CNI plugin captures for an injected pod without traffic
// annotations: every inbound port but the agent's, every outbound destination but
// the status port.
func Sidecar() Settings {
	return Settings{
		redirect.FieldInboundPorts:         "*",
		redirect.FieldInboundPortsExclude:  "15020,15021,15090",
		redirect.FieldOutboundCIDRs:        "*",
		redirect.FieldOutboundPortsExclude: "15020",
	}
}

// With returns a copy of s with more settings.
func (s Settings) With(more Settings) Settings {
	out := Settings{}
	for k, v := range s {
		out[k] = v
	}
	for k, v := range more {
		out[k] = v
	}
	return out
}

// Plan is the plan of the settings, failing tb when they do not build.
func (s Settings) Plan(tb testing.TB) *redirect.Plan {
	tb.Helper()
	spec, err := s.Spec()
	if err != nil {
		tb.Fatalf("capture settings %v: %v", s, err)
	}
	plan, err := redirect.Build(spec)
	if err != nil {
		tb.Fatalf("build the plan of %v: %v", s, err)
	}
	return plan
}

// Prefixes parses each of ss as a prefix, for test tables; a bad one panics.
func Prefixes(ss ...string) []netip.Prefix { return parseAll(ss, netip.MustParsePrefix) }

// Addrs parses each of ss as an address, for test tables; a bad one panics.
func Addrs(ss ...string) []netip.Addr { return parseAll(ss, netip.MustParseAddr) }

func parseAll[T any](ss []string, parse func(string) T) []T {
	var out []T
	for _, s := range ss {
		out = append(out, parse(s))
	}
	return out
}
