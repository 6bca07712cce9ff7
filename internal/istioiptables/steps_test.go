package istioiptables

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestStepsFollowIstiosOrder(t *testing.T) {
	cases := []struct {
		name string
		set  func(c *Config)
		want []Step
	}{
		{"nothing asked applies", func(c *Config) {}, []Step{StepApply}},
		{"dry run prints", func(c *Config) { c.DryRun = true }, []Step{StepPrint}},
		{"cleanup only removes", func(c *Config) { c.CleanupOnly = true }, []Step{StepRemove}},
		{"cleanup only in a dry run only says so", func(c *Config) { c.CleanupOnly, c.DryRun = true, true }, []Step{StepDescribeRemoval}},
		{"validation runs after the apply", func(c *Config) { c.RunValidation = true }, []Step{StepApply, StepValidate}},
		{"validation runs after a removal", func(c *Config) { c.CleanupOnly, c.RunValidation = true, true }, []Step{StepRemove, StepValidate}},
		{"skip rule apply with validation only validates", func(c *Config) { c.SkipRuleApply, c.RunValidation = true, true }, []Step{StepValidate}},
		{"skip rule apply stops a removal", func(c *Config) { c.SkipRuleApply, c.CleanupOnly = true, true }, nil},
		{"skip rule apply stops a removal but not the validation", func(c *Config) { c.SkipRuleApply, c.CleanupOnly, c.RunValidation = true, true, true }, []Step{StepValidate}},
		{"skip rule apply stops printing", func(c *Config) { c.SkipRuleApply, c.DryRun = true, true }, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.set(&cfg)
			if diff := cmp.Diff(tc.want, Steps(cfg)); diff != "" {
				t.Errorf("Steps (-want +got):\n%s", diff)
			}
		})
	}
}
