package cniconf

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// envWrapIn makes the test binary, run again by TestAWrapIsDurableBeforeItEnds,
// wrap the .conf in that directory and exit.
const envWrapIn = "CNICONF_TEST_WRAP_IN"

// TestAWrapIsDurableBeforeItEnds: a wrapped .conf is replaced by NAME.conflist,
// and its removal must reach the disk as the rename did (a directory fsync after
// it). Otherwise a power loss within the file system's commit interval brings the
// .conf back beside the .conflist after the reboot: it sorts first, the runtime
// loads it without the istio-cni entry, and the pods the kubelet restarts before
// the agent runs start without redirection. strace tells the order of the system
// calls: the .conf's unlink must be followed by an fsync of its directory.
func TestAWrapIsDurableBeforeItEnds(t *testing.T) {
	if dir := os.Getenv(envWrapIn); dir != "" {
		if _, err := Install(dir, "10-flannel.conf", testEntry(t)); err != nil {
			t.Fatal(err)
		}
		return
	}
	strace, err := exec.LookPath("strace")
	if err != nil {
		t.Skip("no strace to see the system calls")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "10-flannel.conf"), []byte(`{"cniVersion":"0.3.1","name":"cbr0","type":"flannel"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(strace, "-f", "-y", "-qq", "-e", "trace=unlink,unlinkat,fsync,fdatasync",
		os.Args[0], "-test.run=^TestAWrapIsDurableBeforeItEnds$", "-test.count=1")
	cmd.Env = append(os.Environ(), envWrapIn+"="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil && strings.Contains(string(out), "ptrace") && strings.Contains(string(out), "Operation not permitted") {
		t.Skipf("strace may not trace here: %s", out)
	}
	if err != nil {
		t.Fatalf("%v: %v\n%s", cmd.Args, err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "10-flannel.conflist")); err != nil {
		t.Fatalf("the wrap made no 10-flannel.conflist: %v\n%s", err, out)
	}
	realDir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(realDir, "10-flannel.conf")
	dirSync := regexp.MustCompile(`f(data)?sync\(\d+<` + regexp.QuoteMeta(realDir) + `>\)\s+= 0`)
	unlinked := false
	for line := range strings.Lines(string(out)) {
		switch {
		case strings.Contains(line, "unlink") && strings.Contains(line, `"`+conf+`"`) && strings.Contains(line, "= 0"):
			unlinked = true
		case unlinked && dirSync.MatchString(line):
			return
		}
	}
	if !unlinked {
		t.Fatalf("no unlink of %s seen:\n%s", conf, out)
	}
	t.Errorf("%s was removed and its directory never synced after: a power loss may bring it back beside 10-flannel.conflist, and the runtime loads it first, without the istio-cni entry:\n%s", conf, out)
}
