package iptables

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/istio-cni/istio-cni/internal/capture"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/internal/timing"
	"github.com/istio-cni/istio-cni/test/harness/root"
	"github.com/istio-cni/istio-cni/test/harness/rulestext"
	"github.com/istio-cni/istio-cni/test/harness/specs"
)

// nativeExtraCases reach encodings the golden cases do not: prefixes that are
// not byte-aligned, in both families.
var nativeExtraCases = []backendCase{
	{"odd-prefixes", specs.Settings{redirect.FieldInboundPorts: "*", redirect.FieldOutboundCIDRs: "*",
		redirect.FieldExcludeInterfaces: "veth0", redirect.FieldOutboundCIDRsExclude: "10.1.2.0/23,192.168.0.0/9,fd00:1::/33,fd00:2::/64",
		redirect.FieldIPv6: "true"}},
	{"include-cidrs-odd", specs.Settings{redirect.FieldInboundPorts: "8080", redirect.FieldOutboundCIDRs: "10.0.0.0/7,fd00::/7", redirect.FieldIPv6: "true"}},
}

// TestNativeWritesEqualIptablesRestore proves the native writer's claim: for every
// case and family it translates, the namespace it leaves holds exactly what
// iptables-nft-restore leaves for the same restore input, compared as the kernel
// holds it (every chain's hook, priority, policy and every rule's expressions,
// xtables blobs included) and as iptables-nft-save prints it. It also says which
// cases go through iptables-restore instead, and needs at least the default
// sidecar's to be native (the ADD every meshed pod gets).
func TestNativeWritesEqualIptablesRestore(t *testing.T) {
	root.Require(t)
	if _, err := exec.LookPath("iptables-nft-restore"); err != nil {
		t.Fatalf("iptables-nft-restore not installed: %v", err)
	}
	var cases []backendCase
	for _, rc := range renderCases {
		cases = append(cases, backendCase{rc.name, rc.opts})
	}
	cases = append(append(cases, backendCases...), nativeExtraCases...)
	native := map[string]bool{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			plan := tc.opts.Plan(t)
			for _, fp := range plan.Families {
				want, err := layout(&fp)
				if err != nil {
					t.Fatal(err)
				}
				objs, err := translateNative(fp.Family, want)
				if errors.Is(err, errNotNative) {
					t.Logf("%s: restored with iptables-restore (%v)", fp.Family, err)
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				native[tc.name+"/"+fp.Family.String()] = true
				save, restore := "iptables-nft-save", "iptables-nft-restore"
				if fp.Family == redirect.IPv6 {
					save, restore = "ip6tables-nft-save", "ip6tables-nft-restore"
				}
				restored, written := newNS(t), newNS(t)
				restoreIn(t, restored, restore, restoreText(want, nil))
				if err := netns.Do(written, func() error { return writeNative(objs) }); err != nil {
					t.Fatalf("%s: native write: %v", fp.Family, err)
				}
				if diff := cmp.Diff(kernelView(t, restored), kernelView(t, written)); diff != "" {
					t.Errorf("%s: the kernel holds different objects (-iptables-nft-restore +native):\n%s", fp.Family, diff)
				}
				a, b := rulestext.Saved(runIn(t, restored, save)), rulestext.Saved(runIn(t, written, save))
				if a != b {
					t.Errorf("%s: %s prints different rules:\nafter iptables-nft-restore:\n%s\nafter the native write:\n%s", fp.Family, save, a, b)
				}
			}
		})
	}
	t.Logf("written natively: %d case families %v", len(native), native)
	if !native["default-sidecar/ipv4"] {
		t.Errorf("the default sidecar's IPv4 rules are not written natively")
	}
}

// restoreIn feeds text to restore --noflush in the namespace.
func restoreIn(t *testing.T, ns, restore, text string) {
	t.Helper()
	err := netns.Do(ns, func() error {
		cmd := exec.Command(restore, "--noflush")
		cmd.Stdin = strings.NewReader(text)
		if out, err := cmd.CombinedOutput(); err != nil {
			return errors.New(err.Error() + ": " + string(out))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s in %s: %v", restore, ns, err)
	}
}

// nativeChain is a chain as the kernel holds it, without handles or counters.
type nativeChain struct {
	Table, Name string
	Family      gnft.TableFamily
	Type        gnft.ChainType
	Hook        string
	Priority    string
	Policy      string
	Rules       []string
}

var handleRE = regexp.MustCompile(`Handle:\d+|Position:\d+|Bytes:\d+|Packets:\d+`)

// kernelView reads every table's chains and rules of the namespace over
// netlink, in the kernel's order.
func kernelView(t *testing.T, ns string) []nativeChain {
	t.Helper()
	var out []nativeChain
	err := netns.Do(ns, func() error {
		c, err := gnft.New()
		if err != nil {
			return err
		}
		chains, err := c.ListChains()
		if err != nil {
			return err
		}
		for _, ch := range chains {
			nc := nativeChain{Table: ch.Table.Name, Family: ch.Table.Family, Name: ch.Name, Type: ch.Type,
				Hook: fmtPtr(ch.Hooknum), Priority: fmtPtr(ch.Priority), Policy: fmtPtr(ch.Policy)}
			rules, err := c.GetRules(ch.Table, ch)
			if err != nil {
				return err
			}
			for _, r := range rules {
				var b strings.Builder
				for _, e := range r.Exprs {
					b.WriteString(handleRE.ReplaceAllString(strings.TrimSpace(fmtExpr(e)), "") + "; ")
				}
				b.WriteString("userdata " + string(r.UserData))
				nc.Rules = append(nc.Rules, b.String())
			}
			out = append(out, nc)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("read the nftables objects of %s: %v", ns, err)
	}
	return out
}

// applySidecarInNewNamespace applies the default sidecar plan with an nft-mode
// backend that may write natively, in a new namespace, and returns the phases the
// apply marked, in order.
func applySidecarInNewNamespace(t *testing.T) (b *Backend, ns string, plan *redirect.Plan, phases string) {
	t.Helper()
	dir := t.TempDir()
	b, err := NewBackend(Config{Mode: ModeNFT, LockDir: dir, NativeStateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	plan = specs.Sidecar().Plan(t)
	ns, phases, _ = applyInNewNamespace(t, b, plan)
	return b, ns, plan, phases
}

// applyInNewNamespace applies plan with b in a new namespace, and returns the
// apply's phases and the native writes it recorded as refused.
func applyInNewNamespace(t *testing.T, b *Backend, plan *redirect.Plan) (ns, phases string, refused []error) {
	t.Helper()
	ns = newNS(t)
	rec := timing.Start()
	if _, err := capture.Apply(WithNativeFallbacks(timing.With(context.Background(), rec), &refused), ns, b, plan); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range rec.Phases() {
		names = append(names, p.Name)
	}
	return ns, strings.Join(names, " "), refused
}

// TestApplyWritesANewNamespaceNatively checks the switch in Apply: in nft mode a
// new namespace's default sidecar rules are written without iptables-restore
// (its phase is absent, the native one present), under the namespace's apply
// lock, taken before the apply looks, verify finds them exact, a second apply
// changes nothing, and cleanup removes them.
func TestApplyWritesANewNamespaceNatively(t *testing.T) {
	root.Require(t)
	b, ns, plan, phases := applySidecarInNewNamespace(t)
	if !strings.Contains(phases, "iptables-native-ipv4") || strings.Contains(phases, "iptables-restore-ipv4") {
		t.Errorf("phases %s: want the IPv4 rules written natively, without iptables-restore", phases)
	}
	if !strings.Contains(phases, "iptables-apply-lock iptables-probe") || strings.Contains(phases, "ipv6") {
		t.Errorf("phases %s: want the apply lock taken before the look, and this IPv4 plan not to touch IPv6", phases)
	}
	diffs, err := capture.Verify(context.Background(), ns, b, plan)
	if err != nil || len(diffs) > 0 {
		t.Fatalf("verify after the native write: %v %v", diffs, err)
	}
	if _, err := capture.Cleanup(context.Background(), ns, b, plan); err != nil {
		t.Fatal(err)
	}
	if got := rulestext.Saved(runIn(t, ns, "iptables-nft-save")); strings.Contains(got, redirect.ChainPrefix) {
		t.Errorf("after cleanup:\n%s", got)
	}
}

func fmtPtr[T any](p *T) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%v", *p)
}

// fmtExpr prints an expression with its type and fields; an xtables blob the
// library does not decode is printed as bytes.
func fmtExpr(e expr.Any) string {
	switch v := e.(type) {
	case *expr.Match:
		return fmt.Sprintf("match %s rev %d %T %+v", v.Name, v.Rev, v.Info, v.Info)
	case *expr.Target:
		return fmt.Sprintf("target %s rev %d %T %+v", v.Name, v.Rev, v.Info, v.Info)
	}
	return fmt.Sprintf("%T %+v", e, e)
}

// TestNativeWritesNeedAKnownIptablesNft: the native path is taken only in nft mode,
// with a state directory, and with an iptables-nft of at least 1.8.9, asked once
// and remembered per binary (here stand-in binaries printing a version, first in
// PATH). A replaced binary is asked again.
func TestNativeWritesNeedAKnownIptablesNft(t *testing.T) {
	bin := t.TempDir()
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	stub := func(version string) {
		for _, name := range []string{"iptables-nft-restore", "iptables-nft-save", "ip6tables-nft-restore", "ip6tables-nft-save"} {
			script := "#!/bin/sh\necho '" + name + " " + version + " (nf_tables)'\n"
			if err := os.WriteFile(filepath.Join(bin, name), []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		version string
		dir     bool
		mode    Mode
		want    bool
	}{
		{"v1.8.9", true, ModeNFT, true},
		{"v1.8.11", true, ModeNFT, true},
		{"v1.10.0", true, ModeNFT, true},
		{"v1.8.7", true, ModeNFT, false},
		{"v1.8.9", false, ModeNFT, false},
		{"garbage", true, ModeNFT, false},
	} {
		stub(tc.version)
		dir := ""
		if tc.dir {
			dir = t.TempDir()
		}
		b, err := NewBackend(Config{Mode: tc.mode, LockDir: t.TempDir(), NativeStateDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		if got := b.nativeAllowed(); got != tc.want {
			t.Errorf("iptables-nft %s, state dir %v: native %v, want %v", tc.version, tc.dir, got, tc.want)
		}
		if !tc.want || !tc.dir {
			continue
		}
		// Remembered: a second backend reads the file, even if the binary would
		// now say otherwise, as long as it is the same file.
		remembered, err := os.ReadFile(filepath.Join(dir, nativeVersionFile))
		if err != nil || !strings.Contains(string(remembered), tc.version) {
			t.Errorf("remembered version: %q, %v", remembered, err)
		}
		b2, _ := NewBackend(Config{Mode: tc.mode, LockDir: t.TempDir(), NativeStateDir: dir})
		if !b2.nativeAllowed() {
			t.Errorf("iptables-nft %s: the remembered version was not used", tc.version)
		}
		// A replaced binary (another size) is asked again.
		stub("v1.8.4-replaced")
		b3, _ := NewBackend(Config{Mode: tc.mode, LockDir: t.TempDir(), NativeStateDir: dir})
		if b3.nativeAllowed() {
			t.Errorf("iptables-nft replaced by 1.8.4: still native")
		}
	}
}

// TestParseVersion reads the version line of iptables-nft-restore as the releases
// print it, and refuses legacy builds and lines without a whole version.
func TestParseVersion(t *testing.T) {
	for _, tc := range []struct {
		line    string
		want    [3]int
		wantErr bool
	}{
		{line: "iptables-nft-restore v1.8.9 (nf_tables)\n", want: [3]int{1, 8, 9}},
		{line: "iptables-restore v1.8.11 (nf_tables): no command\n", want: [3]int{1, 8, 11}},
		{line: "ip6tables-nft-restore v1.10.0 (nf_tables)", want: [3]int{1, 10, 0}},
		{line: "xtables-nft-multi v1.8.7 (nf_tables)", want: [3]int{1, 8, 7}},
		{line: "iptables-restore v1.8.9 (legacy)", wantErr: true},
		{line: "iptables-restore 1.8.9 (nf_tables)", wantErr: true},
		{line: "iptables-restore v1.8 (nf_tables)", wantErr: true},
		{line: "iptables-restore v1..9 (nf_tables)", wantErr: true},
		{line: "(nf_tables) v1.8.9", wantErr: true},
		{line: "garbage (nf_tables)", wantErr: true},
		{line: "", wantErr: true},
	} {
		got, err := parseVersion(tc.line)
		if (err != nil) != tc.wantErr {
			t.Errorf("parseVersion(%q) error = %v, want error %v", tc.line, err, tc.wantErr)
			continue
		}
		if err == nil && got != tc.want {
			t.Errorf("parseVersion(%q) = %v, want %v", tc.line, got, tc.want)
		}
	}
}

// TestApplyReportsARefusedNativeWrite: when the kernel refuses the native batch
// (here replaced by a refusal), the restore writes the same rules, verify finds
// them exact, and the refusal is in that apply's record; the next apply on the
// same Backend, whose native write succeeds, records none (the record is the
// apply's own, not the Backend's: the repair controller applies concurrently).
func TestApplyReportsARefusedNativeWrite(t *testing.T) {
	root.Require(t)
	refused := errors.New("netlink: invalid argument (simulated)")
	dir := t.TempDir()
	b, err := NewBackend(Config{Mode: ModeNFT, LockDir: dir, NativeStateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	b.writeNative = func(objs []nativeObjects) error {
		if calls++; calls == 1 {
			return refused
		}
		return writeNative(objs)
	}
	plan := specs.Sidecar().Plan(t)
	ns, phases, got := applyInNewNamespace(t, b, plan)
	if !strings.Contains(phases, "iptables-native-ipv4") || !strings.Contains(phases, "iptables-restore-ipv4") {
		t.Errorf("phases %s: want the native write tried, then the restore", phases)
	}
	if diffs, err := capture.Verify(context.Background(), ns, b, plan); err != nil || len(diffs) > 0 {
		t.Fatalf("verify after the restore: %v %v", diffs, err)
	}
	if len(got) != 1 || !errors.Is(got[0], refused) || !strings.Contains(got[0].Error(), "ipv4 rules") {
		t.Fatalf("the apply recorded %v, want the IPv4 refusal", got)
	}
	if _, phases, again := applyInNewNamespace(t, b, plan); len(again) != 0 || strings.Contains(phases, "iptables-restore-ipv4") {
		t.Errorf("the next apply (written natively: %s) recorded %v, want none", phases, again)
	}
}

// TestCleanupReportsARefusedNativeRemoval: when the kernel refuses the native
// removal, the restore removes the rules, and the refusal is recorded for the
// caller's log (DEL warns with it), not dropped.
func TestCleanupReportsARefusedNativeRemoval(t *testing.T) {
	root.Require(t)
	refused := errors.New("netlink: device or resource busy (simulated)")
	dir := t.TempDir()
	b, err := NewBackend(Config{Mode: ModeNFT, LockDir: dir, NativeStateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	b.cleanupNative = func(redirect.Family) error { return refused }
	plan := specs.Sidecar().Plan(t)
	ns, _, _ := applyInNewNamespace(t, b, plan)
	var got []error
	rec := timing.Start()
	ctx := timing.With(WithNativeFallbacks(context.Background(), &got), rec)
	if _, err := capture.Cleanup(ctx, ns, b, plan); err != nil {
		t.Fatal(err)
	}
	var ran []string
	for _, p := range rec.Phases() {
		if strings.HasPrefix(p.Name, "iptables-") {
			ran = append(ran, p.Name)
		}
	}
	if want := []string{"iptables-native-cleanup-ipv4", "iptables-save-ipv4", "iptables-restore-ipv4"}; !slices.Equal(ran[:min(3, len(ran))], want) {
		t.Errorf("cleanup's steps %q, want %q first", ran, want)
	}
	if out := runIn(t, ns, "iptables-nft-save"); strings.Contains(out, "ISTIO_") {
		t.Errorf("the restore left rules of ours:\n%s", out)
	}
	if len(got) == 0 || !errors.Is(got[0], refused) || !strings.Contains(got[0].Error(), "native removal was refused") {
		t.Fatalf("the cleanup recorded %v, want the IPv4 refusal", got)
	}
}

// TestNativeWritesAskAHungIptablesNftWithinTheBound: an iptables-nft-restore
// that is a wrapper script whose child hangs (and holds the output pipe) is
// asked its version for at most versionBound and RunWaitDelay; the answer is
// then no native writes (restores), not a plugin that waits for the child.
func TestNativeWritesAskAHungIptablesNftWithinTheBound(t *testing.T) {
	bin := t.TempDir()
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	for _, name := range []string{"iptables-nft-restore", "iptables-nft-save", "ip6tables-nft-restore", "ip6tables-nft-save"} {
		// The child outlives the test's bound below, then exits by itself.
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\nsleep 30 & wait\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := NewBackend(Config{Mode: ModeNFT, LockDir: t.TempDir(), NativeStateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan bool, 1)
	start := time.Now()
	go func() { got <- b.nativeAllowed() }()
	select {
	case native := <-got:
		if native {
			t.Error("an iptables-nft that never answered its version: native writes")
		}
		if took := time.Since(start); took > versionBound+RunWaitDelay+time.Second {
			t.Errorf("asking took %v, want at most versionBound (%v) and RunWaitDelay (%v)", took, versionBound, RunWaitDelay)
		}
	case <-time.After(versionBound + RunWaitDelay + 5*time.Second):
		t.Fatal("the version probe still waits for the killed binary's child, which holds its output")
	}
}
