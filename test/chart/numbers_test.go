package chart

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestNumbersOfAValuesFileRenderAsWritten: helm reads the numbers of a values file (-f)
// as float64 (--set gives int64), and a template that prints one as it is writes an
// integer of 1,000,000 or more in exponent form ("2.097152e+08"). An env value must come
// out as the values file has it, as its digits: the Go runtime refuses
// GOMEMLIMIT=2.097152e+08, and the agent would crash on every node. The DaemonSet's
// integer fields, which the API server reads from either form, must keep their values.
func TestNumbersOfAValuesFileRenderAsWritten(t *testing.T) {
	file := filepath.Join(t.TempDir(), "numbers.yaml")
	values := `env:
  GOMEMLIMIT: 209715200
  SMALL: 42
  RATIO: 0.75
  HUGE: 12345678901234
terminationGracePeriodSeconds: 1000000
probes:
  initialDelaySeconds: 1000000
  periodSeconds: 1234567
  failureThreshold: 2000000
`
	if err := os.WriteFile(file, []byte(values), 0o644); err != nil {
		t.Fatal(err)
	}
	m := mustRender(t, "-f", file) // decodes the DaemonSet strictly
	// The last of a name wins, as the kubelet takes it: env comes after the chart's own
	// variables (GOMEMLIMIT from the memory limit among them).
	env := map[string]string{}
	for _, e := range m.agent(t).Env {
		if e.ValueFrom == nil {
			env[e.Name] = e.Value
		} else {
			delete(env, e.Name)
		}
	}
	for name, want := range map[string]string{"GOMEMLIMIT": "209715200", "SMALL": "42", "RATIO": "0.75", "HUGE": "12345678901234"} {
		if env[name] != want {
			t.Errorf("env.%s in the values file: the agent gets %s=%q, want %q", name, name, env[name], want)
		}
	}
	// The agent is a Go program: one started with the rendered GOMEMLIMIT (this test
	// binary, running no test) must start.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GOMEMLIMIT="+env["GOMEMLIMIT"])
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("a Go program with the rendered GOMEMLIMIT=%s: %v\n%.300s", env["GOMEMLIMIT"], err, out)
	}
	ds := m.daemonSet(t)
	if g := ds.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g != 1000000 {
		t.Errorf("terminationGracePeriodSeconds 1000000: the DaemonSet has %v", g)
	}
	c := m.agent(t)
	type timing struct{ Delay, Period, Failures int32 }
	want := timing{1000000, 1234567, 2000000}
	for name, p := range map[string]timing{
		"liveness":  {c.LivenessProbe.InitialDelaySeconds, c.LivenessProbe.PeriodSeconds, c.LivenessProbe.FailureThreshold},
		"readiness": {c.ReadinessProbe.InitialDelaySeconds, c.ReadinessProbe.PeriodSeconds, c.ReadinessProbe.FailureThreshold},
	} {
		if diff := cmp.Diff(want, p); diff != "" {
			t.Errorf("%s probe timing from the values file (-want +got):\n%s", name, diff)
		}
	}
}
