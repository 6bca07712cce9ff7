package doctor

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// outboundCaptured says whether spec captures an application's TCP connection to
// ap, as the capture's outbound rules order it: an excluded port or range is left
// alone; an included port is captured whatever the address; otherwise the address
// must be in the included ranges (all of them with "*").
func outboundCaptured(spec redirect.Spec, ap netip.AddrPort) bool {
	if slices.Contains(spec.OutboundPortsExclude, ap.Port()) {
		return false
	}
	for _, p := range spec.OutboundCIDRsExclude {
		if p.Contains(ap.Addr()) {
			return false
		}
	}
	if slices.Contains(spec.OutboundPorts, ap.Port()) || spec.OutboundCIDRs.All {
		return true
	}
	for _, p := range spec.OutboundCIDRs.Prefixes {
		if p.Contains(ap.Addr()) {
			return true
		}
	}
	return false
}

// outboundTarget is where the outbound probe of one family connects. A target
// the user named is kept, and when the pod's settings do not capture it, the
// probe cannot tell anything from it (reason says so). The default target is
// kept when captured; otherwise the first captured one of: an address in each
// included range with a common port, then the default address with a common port
// or an included one. None: the pod captures no outbound destination of this family the probe
// could use (reason).
func outboundTarget(spec redirect.Spec, want netip.AddrPort, named bool) (netip.AddrPort, string) {
	if outboundCaptured(spec, want) {
		return want, ""
	}
	if named {
		return netip.AddrPort{}, fmt.Sprintf("cannot tell: the pod's settings do not capture %s (its include and exclude annotations); pass --outbound-target with a destination they capture", want)
	}
	var candidates []netip.AddrPort
	for _, p := range spec.OutboundCIDRs.Prefixes {
		if p.Addr().Is4() != want.Addr().Is4() {
			continue
		}
		if a := p.Masked().Addr().Next(); a.IsValid() && p.Contains(a) {
			for _, port := range []uint16{want.Port(), 80, 8080, 443} {
				candidates = append(candidates, netip.AddrPortFrom(a, port))
			}
		}
	}
	for _, port := range append([]uint16{80, 8080, 443}, spec.OutboundPorts...) {
		candidates = append(candidates, netip.AddrPortFrom(want.Addr(), port))
	}
	for _, c := range candidates {
		if outboundCaptured(spec, c) {
			return c, ""
		}
	}
	return netip.AddrPort{}, "cannot tell: the pod's settings capture no outbound destination of this family to probe"
}
