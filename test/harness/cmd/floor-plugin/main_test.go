package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// The floor plugin logs its ADD as istio-cni does: "took" from its input read to
// its result, and the stdin phase, from main to its input read, apart. A runtime
// that writes the config late shows in the stdin phase only.
func TestAnADDsTookStartsAtItsInput(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "floor-plugin")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	log := filepath.Join(dir, "floor.log")
	cmd := exec.Command(bin)
	cmd.Env = []string{"CNI_COMMAND=ADD", "CNI_ARGS=K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod"}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The config comes a second after the start; the process reaches main a
	// little after Start returns, so its stdin phase is a little shorter than the
	// sleep, and its took (a parse and two writes) far shorter.
	const late = time.Second
	time.Sleep(late)
	conf, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": "pods", "type": "floor-plugin", "log": log,
		"prevResult": map[string]any{"cniVersion": "1.0.0"}})
	stdin.Write(conf)
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Took   time.Duration            `json:"took"`
		Phases map[string]time.Duration `json:"phases"`
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatalf("%s: %v", data, err)
	}
	if rec.Phases["stdin"] < late/2 {
		t.Errorf("stdin phase %s, want most of the %s the config came late", rec.Phases["stdin"], late)
	}
	if rec.Took >= late/2 {
		t.Errorf("took %s includes the wait for the input (%s)", rec.Took, late)
	}
}
