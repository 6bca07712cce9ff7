package redirect

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Check verifies the invariants every plan must hold, whatever the spec:
// every jump lands on a chain of ours that exists in the same family and table, every
// chain is declared once and used, a chain that jumps to another is itself jumped
// to, only our chains and the PREROUTING/OUTPUT hooks are touched, and port matches
// always name their protocol.
func (p *Plan) Check() error {
	var errs []error
	seenFamily := map[Family]bool{}
	for _, fp := range p.Families {
		if seenFamily[fp.Family] {
			errs = append(errs, fmt.Errorf("family %s planned twice", fp.Family))
		}
		seenFamily[fp.Family] = true
		lastTable := -1
		for _, tp := range fp.Tables {
			where := fmt.Sprintf("%s %s", fp.Family, tp.Table)
			idx := slices.Index(TableOrder, tp.Table)
			if idx <= lastTable {
				errs = append(errs, fmt.Errorf("%s: table out of order or duplicated", where))
			}
			lastTable = idx
			declared := map[string]bool{}
			for _, c := range tp.Chains {
				if declared[c] {
					errs = append(errs, fmt.Errorf("%s: chain %s declared twice", where, c))
				}
				declared[c] = true
				if !strings.HasPrefix(c, ChainPrefix) || len(c) > 28 {
					errs = append(errs, fmt.Errorf("%s: chain %q is not one of ours", where, c))
				}
			}
			final, err := tp.FinalChains()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", where, err))
				continue
			}
			for chain, rules := range final {
				if !IsBuiltin(chain) && !declared[chain] {
					errs = append(errs, fmt.Errorf("%s: rules in undeclared chain %s", where, chain))
				}
				if IsBuiltin(chain) && chain != ChainPrerouting && chain != ChainOutput {
					errs = append(errs, fmt.Errorf("%s: rules in hook %s, which the capture never uses", where, chain))
				}
				for _, r := range rules {
					if err := r.check(declared); err != nil {
						errs = append(errs, fmt.Errorf("%s chain %s: %w", where, chain, err))
					}
				}
			}
			// The plugin's CHECK tells a capture cut off from a whole one by these
			// two (CutOff), whatever plan wrote it.
			jumpedTo := map[string]bool{}
			for chain, rules := range final {
				for _, r := range rules {
					if r.Target.Kind == TargetJump && r.Target.Chain != chain {
						jumpedTo[r.Target.Chain] = true
					}
				}
			}
			for c := range declared {
				if len(final[c]) == 0 {
					errs = append(errs, fmt.Errorf("%s: chain %s declared but empty", where, c))
				}
				if !jumpedTo[c] && slices.ContainsFunc(final[c], func(r Rule) bool { return r.Target.Kind == TargetJump && r.Target.Chain != c }) {
					errs = append(errs, fmt.Errorf("%s: chain %s jumps to another, but no rule jumps to it", where, c))
				}
			}
		}
	}
	if !seenFamily[IPv4] {
		errs = append(errs, errors.New("no IPv4 plan"))
	}
	return errors.Join(errs...)
}

func (r Rule) check(declared map[string]bool) error {
	hasProto := false
	for _, m := range r.Matches {
		switch m.Kind {
		case MatchProtocol:
			hasProto = true
		case MatchDestPort, MatchSourcePort:
			if !hasProto {
				return fmt.Errorf("port match without a protocol before it")
			}
			if len(m.Ports) == 0 || slices.Contains(m.Ports, 0) {
				return fmt.Errorf("port match with no or zero ports")
			}
		case MatchSource, MatchDest:
			if !m.Prefix.IsValid() {
				return fmt.Errorf("address match without an address")
			}
		}
	}
	switch r.Target.Kind {
	case TargetJump:
		if !declared[r.Target.Chain] {
			return fmt.Errorf("jump to %s, which this table does not declare", r.Target.Chain)
		}
	case TargetRedirect, TargetTProxy:
		if r.Target.Port == 0 {
			return fmt.Errorf("redirect to port 0")
		}
		if !hasProto {
			return fmt.Errorf("redirect without a protocol")
		}
	case 0:
		return fmt.Errorf("rule without a target")
	}
	return nil
}
