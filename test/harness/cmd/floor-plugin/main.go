// Command floor-plugin is a chained CNI plugin that does nothing but what every
// chained plugin must: read its config from stdin and print the previous result
// (ADD), or nothing (CHECK, DEL, STATUS, GC). The burst benchmark
// (test/nodee2e) chains it beside istio-cni and times it the way istio-cni logs
// its own ADD: "took" from its input read (the end of stdin) to its result
// written, and the "stdin" phase from main to its input read, the wait for the
// runtime to write it. In the same bursts, its p99/p50 is the floor the machine
// sets for any plugin process, whatever the plugin does.
//
// Its config takes one field of its own, "log": the file each ADD appends one
// JSON line to ({"command":"ADD","pod":"ns/name","took":ns,"phases":{"stdin":ns}}).
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

func main() {
	start := time.Now()
	if err := run(start); err != nil {
		// The CNI error format: the runtime shows msg in the pod's events.
		out, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "code": 999, "msg": "floor-plugin: " + err.Error()})
		os.Stdout.Write(out)
		os.Exit(1)
	}
}

func run(start time.Time) error {
	switch cmd := os.Getenv("CNI_COMMAND"); cmd {
	case "VERSION":
		_, err := os.Stdout.WriteString(`{"cniVersion":"1.1.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}`)
		return err
	case "ADD":
	case "CHECK", "DEL", "STATUS", "GC":
		_, err := io.Copy(io.Discard, os.Stdin)
		return err
	default:
		return fmt.Errorf("CNI_COMMAND %q: not a CNI command", cmd)
	}
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		return fmt.Errorf("read stdin: %w", err)
	}
	input := time.Now()
	stdin := input.Sub(start)
	var conf struct {
		CNIVersion string                     `json:"cniVersion"`
		Log        string                     `json:"log"`
		PrevResult map[string]json.RawMessage `json:"prevResult"`
	}
	if err := json.Unmarshal(in, &conf); err != nil {
		return fmt.Errorf("decode config: %w", err)
	}
	if conf.PrevResult == nil {
		return fmt.Errorf("prevResult: missing (a chained plugin runs after the primary)")
	}
	v, err := json.Marshal(conf.CNIVersion)
	if err != nil {
		return err
	}
	conf.PrevResult["cniVersion"] = v
	out, err := json.Marshal(conf.PrevResult)
	if err != nil {
		return err
	}
	if _, err := os.Stdout.Write(out); err != nil {
		return fmt.Errorf("write result: %w", err)
	}
	if conf.Log == "" {
		return nil
	}
	rec, err := json.Marshal(map[string]any{
		"command": "ADD",
		"pod":     podName(os.Getenv("CNI_ARGS")),
		"took":    time.Since(input),
		"phases":  map[string]time.Duration{"stdin": stdin},
	})
	if err != nil {
		return err
	}
	f, err := os.OpenFile(conf.Log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("log: %w", err)
	}
	defer f.Close()
	_, err = f.Write(append(rec, '\n')) // one write: lines of processes running at once do not interleave
	return err
}

// podName is "namespace/name" from CNI_ARGS's K8S_POD_NAMESPACE and K8S_POD_NAME.
func podName(args string) string {
	var ns, name string
	for _, kv := range strings.Split(args, ";") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "K8S_POD_NAMESPACE":
			ns = v
		case "K8S_POD_NAME":
			name = v
		}
	}
	return ns + "/" + name
}
