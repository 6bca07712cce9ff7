package doctor

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/istio-cni/istio-cni/internal/plugin"
)

// Main runs the istio-cni-doctor command line and returns the exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "explain":
		return explainCmd(args[1:], stdin, stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "istio-cni-doctor: unknown command %q\n\n%s", args[0], usage)
	return 2
}

const usage = `Usage: istio-cni-doctor COMMAND [flags]

Answers "is this pod's traffic redirected, and if not, why?" with the plugin's own logic.

Commands:
  explain -f POD.yaml   the plugin's decision for a pod manifest (no cluster needed)
                        and the exact rules it would program

Run "istio-cni-doctor COMMAND -h" for a command's flags.
`

func explainCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("f", "", "pod manifest (YAML or JSON, as kubectl get pod -o yaml prints it); - reads stdin")
	configFile := fs.String("config", "", "the plugin's CNI config (JSON), e.g. the istio-cni entry of the node's conflist; default: Istio's defaults")
	exclude := fs.String("exclude-namespaces", "", "comma-separated namespaces the plugin skips (overrides the config)")
	backend := fs.String("backend", "iptables", `rules to show: "iptables" or "nftables"`)
	output := fs.String("o", "text", `output format: "text" or "json"`)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *file == "" {
		fmt.Fprintln(stderr, "explain: -f POD.yaml is required")
		return 2
	}
	if *backend != "iptables" && *backend != "nftables" {
		fmt.Fprintf(stderr, "explain: -backend %q: want iptables or nftables\n", *backend)
		return 2
	}
	if *output != "text" && *output != "json" {
		fmt.Fprintf(stderr, "explain: -o %q: want text or json\n", *output)
		return 2
	}
	var data []byte
	var err error
	if *file == "-" {
		data, err = io.ReadAll(stdin)
	} else {
		data, err = os.ReadFile(*file)
	}
	if err != nil {
		fmt.Fprintf(stderr, "explain: %v\n", err)
		return 1
	}
	pod, err := DecodePod(data)
	if err != nil {
		fmt.Fprintf(stderr, "explain: %s: %v\n", *file, err)
		return 1
	}
	confJSON := []byte(`{"cniVersion":"1.1.0","name":"istio-cni","type":"istio-cni"}`)
	if *configFile != "" {
		if confJSON, err = os.ReadFile(*configFile); err != nil {
			fmt.Fprintf(stderr, "explain: %v\n", err)
			return 1
		}
	}
	cfg, err := plugin.ParseConfig(confJSON)
	if err != nil {
		fmt.Fprintf(stderr, "explain: %s: %v\n", *configFile, err)
		return 1
	}
	if *exclude != "" {
		cfg.ExcludeNamespaces = strings.Split(*exclude, ",")
	}
	ex := Explain(pod, cfg, *backend, nil)
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(ex); err != nil {
			fmt.Fprintf(stderr, "explain: %v\n", err)
			return 1
		}
	} else {
		fmt.Fprint(stdout, ex.Text())
	}
	if ex.Error != "" {
		return 1
	}
	return 0
}
