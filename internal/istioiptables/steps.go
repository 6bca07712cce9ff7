package istioiptables

// Step is one thing an invocation does.
type Step uint8

const (
	// StepRemove removes the capture (--cleanup-only).
	StepRemove Step = iota + 1
	// StepDescribeRemoval only says that the capture would be removed
	// (--cleanup-only --dry-run).
	StepDescribeRemoval
	// StepPrint prints the rules (--dry-run).
	StepPrint
	// StepApply programs the capture.
	StepApply
	// StepValidate checks that traffic reaches the proxy (--run-validation).
	StepValidate
)

func (s Step) String() string {
	switch s {
	case StepRemove:
		return "remove"
	case StepDescribeRemoval:
		return "describe removal"
	case StepPrint:
		return "print"
	case StepApply:
		return "apply"
	case StepValidate:
		return "validate"
	}
	return "step?"
}

// Steps is what an invocation does, in order, as in Istio: unless
// --skip-rule-apply, remove the capture (--cleanup-only) or print it (--dry-run)
// or apply it; then, whichever of those ran, validate (--run-validation).
// --skip-rule-apply stops a removal too: in Istio the removal is part of the rule
// apply it skips.
func Steps(cfg Config) []Step {
	var out []Step
	if !cfg.SkipRuleApply {
		switch {
		case cfg.CleanupOnly && cfg.DryRun:
			out = append(out, StepDescribeRemoval)
		case cfg.CleanupOnly:
			out = append(out, StepRemove)
		case cfg.DryRun:
			out = append(out, StepPrint)
		default:
			out = append(out, StepApply)
		}
	}
	if cfg.RunValidation {
		out = append(out, StepValidate)
	}
	return out
}
