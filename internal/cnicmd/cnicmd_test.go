package cnicmd

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/google/go-cmp/cmp"
)

var versions = version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

// addEnv is a valid ADD's environment.
func addEnv() map[string]string {
	return map[string]string{
		"CNI_COMMAND":     "ADD",
		"CNI_CONTAINERID": "0123456789abcdef",
		"CNI_NETNS":       "/var/run/netns/cni-test",
		"CNI_IFNAME":      "eth0",
		"CNI_PATH":        "/opt/cni/bin",
		"CNI_ARGS":        "K8S_POD_NAMESPACE=default;K8S_POD_NAME=p",
	}
}

func with(env map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range env {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			delete(out, kv[i])
		} else {
			out[kv[i]] = kv[i+1]
		}
	}
	return out
}

const conf11 = `{"cniVersion":"1.1.0","name":"k8s-pod-network","type":"istio-cni"}`

// inputs are the cases both dispatchers are run on. names, when set, are what
// the error's message must hold where skel's does not: the spec has the message
// of an invalid variable (4) name it, and a value at fault (a variable's, the
// network's name, the config's version) is quoted; the rest of the outcome is
// skel's.
var inputs = []struct {
	name  string
	env   map[string]string
	stdin string
	names []string
}{
	{"add", addEnv(), conf11, nil},
	{"add-old-config", addEnv(), `{"cniVersion":"0.3.1","name":"n","type":"istio-cni"}`, nil},
	{"add-no-version", addEnv(), `{"name":"n","type":"istio-cni"}`, nil},
	{"add-unsupported-version", addEnv(), `{"cniVersion":"0.2.0","name":"n"}`, nil},
	{"add-future-version", addEnv(), `{"cniVersion":"9.0.0","name":"n"}`, nil},
	{"add-bad-version", addEnv(), `{"cniVersion":"one","name":"n"}`, nil},
	{"add-no-name", addEnv(), `{"cniVersion":"1.1.0"}`, nil},
	{"add-bad-name", addEnv(), `{"cniVersion":"1.1.0","name":"-n"}`, []string{"network name", `"-n"`}},
	{"add-name-with-slash", addEnv(), `{"cniVersion":"1.1.0","name":"a/b"}`, []string{"network name", `"a/b"`}},
	{"add-not-json", addEnv(), `{"cniVersion":`, nil},
	{"add-not-an-object", addEnv(), `["n"]`, nil},
	{"add-null", addEnv(), `null`, nil},
	{"add-name-not-a-string", addEnv(), `{"cniVersion":"1.1.0","name":5}`, nil},
	{"add-version-not-a-string", addEnv(), `{"cniVersion":1.1,"name":"n"}`, nil},
	{"add-keys-in-other-cases", addEnv(), `{"CNIVERSION":"0.3.1","Name":"n"}`, nil},
	{"add-duplicate-and-null-keys", addEnv(), `{"cniVersion":"0.3.1","name":"a","name":"n","cniVersion":null}`, nil},
	{"add-escaped-name", addEnv(), `{"cniVersion":"1.1.0","name":"k8s\u002dnet"}`, nil},
	{"add-missing-netns-and-ifname", with(addEnv(), "CNI_NETNS", "", "CNI_IFNAME", ""), conf11, nil},
	{"add-bad-container-id", with(addEnv(), "CNI_CONTAINERID", "abc def"), conf11, []string{"CNI_CONTAINERID", `"abc def"`}},
	{"add-container-id-leading-dot", with(addEnv(), "CNI_CONTAINERID", ".abc"), conf11, []string{"CNI_CONTAINERID", `".abc"`}},
	{"add-container-id-dashes", with(addEnv(), "CNI_CONTAINERID", "a-b_c.d"), conf11, nil},
	{"add-long-ifname", with(addEnv(), "CNI_IFNAME", "eth0123456789012"), conf11, []string{"CNI_IFNAME", `"eth0123456789012"`, "too long"}},
	{"add-ifname-dotdot", with(addEnv(), "CNI_IFNAME", ".."), conf11, []string{"CNI_IFNAME", `".."`}},
	{"add-ifname-colon", with(addEnv(), "CNI_IFNAME", "eth:0"), conf11, []string{"CNI_IFNAME", `"eth:0"`}},
	{"add-ifname-space", with(addEnv(), "CNI_IFNAME", "eth\u00a00"), conf11, []string{"CNI_IFNAME", `"eth\u00a00"`}},
	{"del", with(addEnv(), "CNI_COMMAND", "DEL", "CNI_NETNS", ""), conf11, nil},
	{"del-no-container-id", with(addEnv(), "CNI_COMMAND", "DEL", "CNI_CONTAINERID", ""), conf11, nil},
	{"check", with(addEnv(), "CNI_COMMAND", "CHECK"), conf11, nil},
	{"check-old-config", with(addEnv(), "CNI_COMMAND", "CHECK"), `{"cniVersion":"0.3.1","name":"n"}`, []string{"config version does not allow CHECK", `"0.3.1"`, "0.4.0"}},
	{"gc", map[string]string{"CNI_COMMAND": "GC", "CNI_PATH": "/opt/cni/bin"}, conf11, nil},
	{"gc-1.0", map[string]string{"CNI_COMMAND": "GC", "CNI_PATH": "/opt/cni/bin"}, `{"cniVersion":"1.0.0","name":"n"}`, []string{"config version does not allow GC", `"1.0.0"`, "1.1.0"}},
	{"status", map[string]string{"CNI_COMMAND": "STATUS", "CNI_PATH": "/opt/cni/bin"}, conf11, nil},
	{"status-0.4", map[string]string{"CNI_COMMAND": "STATUS", "CNI_PATH": "/opt/cni/bin"}, `{"cniVersion":"0.4.0","name":"n"}`, []string{"config version does not allow STATUS", `"0.4.0"`, "1.1.0"}},
	{"status-future-version", map[string]string{"CNI_COMMAND": "STATUS", "CNI_PATH": "/opt/cni/bin"}, `{"cniVersion":"9.0.0","name":"n"}`, []string{"plugin version does not allow STATUS", `"9.0.0"`, "1.1.0"}},
	{"version", map[string]string{"CNI_COMMAND": "VERSION"}, "", nil},
	{"no-command", map[string]string{}, conf11, nil},
	{"no-command-at-all", map[string]string{"CNI_PATH": "/x"}, conf11, nil},
}

// outcome is what a dispatcher did: the command it called, with which arguments,
// its error and its output.
type outcome struct {
	Called string
	Args   *CmdArgs
	Code   uint
	Msg    string
	Detail string
	Stdout string
	Stderr string
}

func recorder(o *outcome) (Funcs, skel.CNIFuncs) {
	call := func(name string) func(*CmdArgs) error {
		return func(a *CmdArgs) error {
			o.Called, o.Args = name, a
			return nil
		}
	}
	fromSkel := func(name string) func(*skel.CmdArgs) error {
		return func(a *skel.CmdArgs) error {
			o.Called = name
			o.Args = &CmdArgs{ContainerID: a.ContainerID, Netns: a.Netns, IfName: a.IfName, Args: a.Args, Path: a.Path, NetnsOverride: a.NetnsOverride, StdinData: a.StdinData}
			return nil
		}
	}
	return Funcs{Add: call("ADD"), Del: call("DEL"), Check: call("CHECK"), GC: call("GC"), Status: call("STATUS")},
		skel.CNIFuncs{Add: fromSkel("ADD"), Del: fromSkel("DEL"), Check: fromSkel("CHECK"), GC: fromSkel("GC"), Status: fromSkel("STATUS")}
}

func (o *outcome) setErr(e *types.Error) {
	if e != nil {
		o.Code, o.Msg, o.Detail = e.Code, e.Msg, e.Details
	}
}

func runOurs(env map[string]string, stdin string) outcome {
	var o outcome
	funcs, _ := recorder(&o)
	var stdout, stderr bytes.Buffer
	o.setErr(Run(Env{Getenv: func(k string) string { return env[k] }, Stdin: strings.NewReader(stdin), Stdout: &stdout, Stderr: &stderr}, funcs, versions, "istio-cni test"))
	o.Stdout, o.Stderr = stdout.String(), stderr.String()
	return o
}

// runSkel runs the CNI library's dispatcher on the same input: it reads the
// process's environment and stdin, and writes to its stdout and stderr.
func runSkel(t *testing.T, env map[string]string, stdin string) outcome {
	t.Helper()
	for _, k := range []string{"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH", "CNI_NETNS_OVERRIDE"} {
		t.Setenv(k, env[k])
	}
	var o outcome
	_, funcs := recorder(&o)
	in, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		io.WriteString(inW, stdin)
		inW.Close()
	}()
	outR, outW, _ := os.Pipe()
	errR, errW, _ := os.Pipe()
	oldIn, oldOut, oldErr := os.Stdin, os.Stdout, os.Stderr
	os.Stdin, os.Stdout, os.Stderr = in, outW, errW
	outC, errC := readAll(outR), readAll(errR)
	e := skel.PluginMainFuncsWithError(funcs, versions, "istio-cni test")
	os.Stdin, os.Stdout, os.Stderr = oldIn, oldOut, oldErr
	outW.Close()
	errW.Close()
	in.Close()
	o.setErr(e)
	o.Stdout, o.Stderr = <-outC, <-errC
	return o
}

func readAll(r *os.File) chan string {
	c := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(r)
		r.Close()
		c <- string(b)
	}()
	return c
}

// TestRunDoesWhatSkelDoes runs each input through this package and through the
// CNI library's skel: the same command called with the same arguments, or the
// same error (code, message and details), and the same output.
func TestRunDoesWhatSkelDoes(t *testing.T) {
	for _, tc := range inputs {
		t.Run(tc.name, func(t *testing.T) {
			want := runSkel(t, tc.env, tc.stdin)
			got := runOurs(tc.env, tc.stdin)
			if tc.names != nil {
				for _, n := range tc.names {
					if !strings.Contains(got.Msg, n) {
						t.Errorf("error %d %q does not name %s", got.Code, got.Msg, n)
					}
				}
				if want.Code == 0 || want.Msg == got.Msg {
					t.Errorf("skel's error is %d %q: is the difference still needed?", want.Code, want.Msg)
				}
				want.Msg, want.Detail = got.Msg, got.Detail
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Run differs from skel (-skel +ours):\n%s", diff)
			}
		})
	}
}

// TestRunRefusesWhatSkelWouldNotCatch: the cases where this dispatcher is stricter
// than the library's, each refused before the command runs, naming the cause.
func TestRunRefusesWhatSkelWouldNotCatch(t *testing.T) {
	big := `{"cniVersion":"1.1.0","name":"n","pad":"` + strings.Repeat("x", MaxConfigBytes) + `"}`
	for _, tc := range []struct {
		name     string
		env      map[string]string
		stdin    string
		wantCode uint
		wantMsg  string
	}{
		{"stdin over the bound", addEnv(), big, types.ErrInvalidNetworkConfig, "network config on stdin: more than 4194304 bytes"},
		{"own netns on ADD, refused before ADD runs", with(addEnv(), "CNI_NETNS", "/proc/self/ns/net"), conf11, types.ErrInvalidEnvironmentVariables, `CNI_NETNS "/proc/self/ns/net": plugin's netns and netns from CNI_NETNS should not be the same (the runtime's own network namespace, not a container's)`},
		{"own netns on CHECK, refused (skel lets it judge the host's rules)", with(addEnv(), "CNI_COMMAND", "CHECK", "CNI_NETNS", "/proc/self/ns/net"), conf11, types.ErrInvalidEnvironmentVariables, `CNI_NETNS "/proc/self/ns/net": plugin's netns and netns from CNI_NETNS should not be the same (the runtime's own network namespace, not a container's)`},
		{"container ID over the bound", with(addEnv(), "CNI_CONTAINERID", strings.Repeat("a", 100<<10)), conf11, types.ErrInvalidEnvironmentVariables, "CNI_CONTAINERID is 102400 bytes, longer than the limit of 1024"},
		{"network name over the bound", addEnv(), `{"cniVersion":"1.1.0","name":"` + strings.Repeat("n", maxNameLength+1) + `"}`, types.ErrInvalidNetworkConfig, "network name is 1025 bytes, longer than the limit of 1024"},
		{"unknown command", with(addEnv(), "CNI_COMMAND", "UPDATE"), conf11, types.ErrInvalidEnvironmentVariables, "unknown CNI_COMMAND: UPDATE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := runOurs(tc.env, tc.stdin)
			if got.Called != "" {
				t.Errorf("%s was called; want it refused first", got.Called)
			}
			if got.Code != tc.wantCode || got.Msg != tc.wantMsg {
				t.Errorf("error = %d %q, want %d %q", got.Code, got.Msg, tc.wantCode, tc.wantMsg)
			}
			// A value over its bound is quoted by its start, never whole.
			if len(got.Detail) > 100 {
				t.Errorf("the error's details are %d bytes: the value was echoed", len(got.Detail))
			}
		})
	}
	// Overriding the check lets the command run (CNI_NETNS_OVERRIDE, as skel).
	got := runOurs(with(addEnv(), "CNI_NETNS", "/proc/self/ns/net", "CNI_NETNS_OVERRIDE", "true"), conf11)
	if got.Called != "ADD" || got.Code != 0 {
		t.Errorf("with CNI_NETNS_OVERRIDE: called %q, error %d %q; want ADD, no error", got.Called, got.Code, got.Msg)
	}
}

// TestRunReturnsTheCommandsError: a CNI error keeps its code; any other error is
// an internal one (999) with its text.
func TestRunReturnsTheCommandsError(t *testing.T) {
	for _, tc := range []struct {
		err      error
		wantCode uint
		wantMsg  string
	}{
		{types.NewError(types.ErrTryAgainLater, "later", "d"), types.ErrTryAgainLater, "later"},
		{errors.Join(errors.New("ctx"), types.NewError(types.ErrIOFailure, "io", "")), types.ErrIOFailure, "io"},
		{errors.New("plain"), types.ErrInternal, "plain"},
	} {
		funcs := Funcs{Add: func(*CmdArgs) error { return tc.err }}
		env := addEnv()
		e := Run(Env{Getenv: func(k string) string { return env[k] }, Stdin: strings.NewReader(conf11), Stdout: io.Discard, Stderr: io.Discard}, funcs, versions, "")
		if e == nil || e.Code != tc.wantCode || e.Msg != tc.wantMsg {
			t.Errorf("Run with %v = %v, want code %d %q", tc.err, e, tc.wantCode, tc.wantMsg)
		}
	}
}

// TestPrintErrorIsTheSpecsJSON: the error printed on stdout decodes as the spec's
// error object, cniVersion first, as the CNI library reads it back.
func TestPrintErrorIsTheSpecsJSON(t *testing.T) {
	var buf bytes.Buffer
	if err := PrintError(&buf, types.NewError(types.ErrInvalidNetNS, "msg", "details"), "0.4.0"); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"cniVersion": "0.4.0", "code": float64(types.ErrInvalidNetNS), "msg": "msg", "details": "details"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("printed error (-want +got):\n%s", diff)
	}
	var lib types.Error
	if err := json.Unmarshal(buf.Bytes(), &lib); err != nil || lib.Code != types.ErrInvalidNetNS || lib.Msg != "msg" || lib.Details != "details" {
		t.Errorf("the CNI library reads %+v (%v), want the code, msg and details", lib, err)
	}
}

// TestAnErrorIsOfTheProtocolVersionInUse: an error's object is of the config's
// version when the plugin speaks it, else of the newest it speaks (no config
// read, a config of no version or of one refused).
func TestAnErrorIsOfTheProtocolVersionInUse(t *testing.T) {
	for _, tc := range []struct {
		name  string
		env   map[string]string
		stdin string
		want  string
	}{
		{"a 0.3.1 config", with(addEnv(), "CNI_COMMAND", "CHECK"), `{"cniVersion":"0.3.1","name":"n"}`, "0.3.1"},
		{"a 1.0.0 config", with(addEnv(), "CNI_COMMAND", "STATUS"), `{"cniVersion":"1.0.0","name":"n"}`, "1.0.0"},
		{"an ADD's own error, 0.4.0", addEnv(), `{"cniVersion":"0.4.0","name":"n"}`, "0.4.0"},
		{"a 0.2.0 config", addEnv(), `{"cniVersion":"0.2.0","name":"n"}`, "1.1.0"},
		{"no config read", with(addEnv(), "CNI_IFNAME", ""), `{"cniVersion":"0.4.0","name":"n"}`, "1.1.0"},
		{"a config without a name", addEnv(), `{"cniVersion":"0.4.0"}`, "1.1.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			funcs := Funcs{Add: func(*CmdArgs) error { return errors.New("failed") }}
			confVersion, e := run(Env{Getenv: func(k string) string { return tc.env[k] }, Stdin: strings.NewReader(tc.stdin), Stdout: io.Discard, Stderr: io.Discard}, funcs, versions, "")
			if e == nil {
				t.Fatal("no error")
			}
			if got := ErrorVersion(confVersion, versions); got != tc.want {
				t.Errorf("error %q is of %q, want %q", e.Msg, got, tc.want)
			}
		})
	}
}

// TestRefusedHearsOfWhatTheDispatchRefuses: a command refused after its config was
// read and before its function ran (the config's version, CHECK below 0.4.0, the
// plugin's own namespace as CNI_NETNS) reaches Funcs.Refused with the very error
// the runtime gets, so the plugin can tell its agent; a command the dispatch lets
// through, or refuses before reading the config, does not.
func TestRefusedHearsOfWhatTheDispatchRefuses(t *testing.T) {
	own := "/proc/self/ns/net"
	for _, tc := range []struct {
		name    string
		env     map[string]string
		stdin   string
		refused bool
	}{
		{"ADD of a 0.2.0 config", addEnv(), `{"cniVersion":"0.2.0","name":"n","type":"istio-cni"}`, true},
		{"ADD of a config without a name", addEnv(), `{"cniVersion":"1.0.0","type":"istio-cni"}`, true},
		{"CHECK of a 0.3.1 config", with(addEnv(), "CNI_COMMAND", "CHECK"), `{"cniVersion":"0.3.1","name":"n","type":"istio-cni"}`, true},
		{"ADD into the plugin's own namespace", with(addEnv(), "CNI_NETNS", own), conf11, true},
		{"ADD let through", addEnv(), conf11, false},
		{"ADD without CNI_IFNAME (before the config is read)", with(addEnv(), "CNI_IFNAME", ""), conf11, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var heard []string
			var heardErr *types.Error
			funcs := Funcs{Add: func(*CmdArgs) error { return nil }, Check: func(*CmdArgs) error { return nil },
				Refused: func(cmd string, args *CmdArgs, err *types.Error) {
					heard = append(heard, cmd+" "+string(args.StdinData))
					heardErr = err
				}}
			e := Run(Env{Getenv: func(k string) string { return tc.env[k] }, Stdin: strings.NewReader(tc.stdin), Stdout: io.Discard, Stderr: io.Discard}, funcs, versions, "")
			switch {
			case tc.refused && (len(heard) != 1 || heardErr != e || e == nil):
				t.Errorf("Run = %v; Refused heard %q with %v, want it once with that error", e, heard, heardErr)
			case tc.refused && heard[0] != tc.env["CNI_COMMAND"]+" "+tc.stdin:
				t.Errorf("Refused heard %q, want the command and its config", heard[0])
			case !tc.refused && len(heard) != 0:
				t.Errorf("Run = %v; Refused heard %q, want nothing", e, heard)
			}
		})
	}
}

// TestRunFollowsTheSpecWhereSkelDoesNot: the cases where the CNI library's skel
// departs from the spec (1.1.0) and this dispatcher does not, each checked
// against skel too so the difference stays deliberate. CNI_PATH is optional but
// for GC. A DEL refused as its ADD was (the config's version, CNI_NETNS the
// plugin's own namespace) succeeds without running: nothing of the ADD is there to
// remove, and a failed DEL stops the runtime's DEL of the chain at this plugin,
// before the primary plugin releases the pod's address. Refused hears of it still.
func TestRunFollowsTheSpecWhereSkelDoesNot(t *testing.T) {
	del := with(addEnv(), "CNI_COMMAND", "DEL")
	status := map[string]string{"CNI_COMMAND": "STATUS"}
	for _, tc := range []struct {
		name        string
		env         map[string]string
		stdin       string
		wantCalled  string
		wantCode    uint // 0: no error
		wantRefused bool
		skelCode    uint // what skel returns instead
	}{
		{"ADD without CNI_PATH", with(addEnv(), "CNI_PATH", ""), conf11, "ADD", 0, false, types.ErrInvalidEnvironmentVariables},
		{"CHECK without CNI_PATH", with(addEnv(), "CNI_COMMAND", "CHECK", "CNI_PATH", ""), conf11, "CHECK", 0, false, types.ErrInvalidEnvironmentVariables},
		{"DEL without CNI_PATH", with(del, "CNI_PATH", ""), conf11, "DEL", 0, false, types.ErrInvalidEnvironmentVariables},
		{"STATUS without CNI_PATH", status, conf11, "STATUS", 0, false, types.ErrInvalidEnvironmentVariables},
		{"DEL of a 0.2.0 config", del, `{"cniVersion":"0.2.0","name":"n","type":"istio-cni"}`, "", 0, true, types.ErrIncompatibleCNIVersion},
		{"DEL of a config of no version (0.1.0)", del, `{"name":"n","type":"istio-cni"}`, "", 0, true, types.ErrIncompatibleCNIVersion},
		{"DEL of a version newer than the plugin's", del, `{"cniVersion":"9.0.0","name":"n"}`, "", 0, true, types.ErrIncompatibleCNIVersion},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if want := runSkel(t, tc.env, tc.stdin); want.Code != tc.skelCode {
				t.Errorf("skel now returns %d %q, not %d: is the difference still needed?", want.Code, want.Msg, tc.skelCode)
			}
			var o outcome
			funcs, _ := recorder(&o)
			refused := false
			funcs.Refused = func(string, *CmdArgs, *types.Error) { refused = true }
			env := tc.env
			o.setErr(Run(Env{Getenv: func(k string) string { return env[k] }, Stdin: strings.NewReader(tc.stdin), Stdout: io.Discard, Stderr: io.Discard}, funcs, versions, ""))
			if o.Called != tc.wantCalled || o.Code != tc.wantCode || refused != tc.wantRefused {
				t.Errorf("called %q, error %d %q, Refused heard %v; want called %q, error %d, heard %v",
					o.Called, o.Code, o.Msg, refused, tc.wantCalled, tc.wantCode, tc.wantRefused)
			}
		})
	}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		stdin   string
		wantMsg string
	}{
		{"GC without CNI_PATH", map[string]string{"CNI_COMMAND": "GC"}, conf11, "required env variables [CNI_PATH] missing"},
		{"ADD of a 0.2.0 config, still refused", addEnv(), `{"cniVersion":"0.2.0","name":"n"}`, "incompatible CNI versions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := runOurs(tc.env, tc.stdin)
			if got.Called != "" || got.Msg != tc.wantMsg {
				t.Errorf("called %q, error %d %q; want it refused with %q", got.Called, got.Code, got.Msg, tc.wantMsg)
			}
		})
	}
	// The plugin's own namespace as a DEL's CNI_NETNS (skel runs the DEL and
	// fails after it; checked here alone, skel would run it).
	var o outcome
	funcs, _ := recorder(&o)
	env := with(del, "CNI_NETNS", "/proc/self/ns/net")
	if e := Run(Env{Getenv: func(k string) string { return env[k] }, Stdin: strings.NewReader(conf11), Stdout: io.Discard, Stderr: io.Discard}, funcs, versions, ""); e != nil || o.Called != "" {
		t.Errorf("DEL into the plugin's own namespace: called %q, error %v; want success without running", o.Called, e)
	}
}
