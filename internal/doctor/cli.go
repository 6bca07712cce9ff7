package doctor

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/istio-cni/istio-cni/internal/kube"
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
	case "inspect":
		return inspectCmd(args[1:], stdout, stderr)
	case "probe":
		return probeCmd(args[1:], stdout, stderr)
	case "logs":
		return logsCmd(args[1:], stdout, stderr)
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
                        and the exact rules it would program; -namespace NS.yaml
                        adds the namespace's labels (Istio's ambient label)
  inspect NS/POD        on the pod's node: the live rules in the pod's network
                        namespace compared with what the pod requires (the plugin's
                        CHECK), stray rules, the node's CNI config and Multus wiring
  probe NS/POD          on the pod's node: test connections inside the pod's network
                        namespace (the validation's and an app's) and where they land
  logs                  the plugin's recent ADD/DEL decisions on this node

In the cluster, run them in the node's agent pod:
  kubectl exec -n kube-system ds/istio-cni-node -- istio-cni-doctor inspect NS/POD
(ds/ picks any node's pod: for a given node select it with
 --field-selector spec.nodeName=NODE, see docs/troubleshooting.md).
inspect and probe need the chart's troubleshooting.enabled=true there (the node's
/proc and the netns capabilities). The image carries iptables (both flavours) and
nft; inspect reads the flavour the node's plugin uses.

Exit codes: 0 all is well, 1 a problem was found (or an error), 2 bad usage,
3 (inspect) the plugin does not redirect this pod and nothing is wrong.

Run "istio-cni-doctor COMMAND -h" for a command's flags.
`

func explainCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("f", "", "pod manifest (YAML or JSON, as kubectl get pod -o yaml prints it); - reads stdin")
	nsFile := fs.String("namespace", "", "the pod's namespace manifest (as kubectl get namespace -o yaml prints it), for its istio.io/dataplane-mode label; "+
		"needed only for a pod without a sidecar whose own label does not decide")
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
	var ns *kube.Namespace
	if *nsFile != "" {
		data, err := os.ReadFile(*nsFile)
		if err == nil {
			ns, err = DecodeNamespace(data)
		}
		if err == nil && ns.Metadata.Name != pod.Metadata.Namespace {
			err = fmt.Errorf("namespace %s is not the pod's (%s)", ns.Metadata.Name, pod.Metadata.Namespace)
		}
		if err != nil {
			fmt.Fprintf(stderr, "explain: %s: %v\n", *nsFile, err)
			return 1
		}
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
	ex := Explain(pod, ns, cfg, *backend, nil)
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

func logsCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("logs", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("log-file", "", "the plugin's log file (default: the config's log_file, else <run dir>/istio-cni.log)")
	runDir := fs.String("run-dir", defaultRunDir(), "the agent's run directory (cni_agent_run_dir; default $CNI_AGENT_RUN_DIR, as the agent pod sets it)")
	configFile := fs.String("config", "", "the plugin's config (its log_file and cni_agent_run_dir say where the log is)")
	since := fs.String("since", "", "only records newer than this: a duration (1h) or an RFC 3339 time")
	pod := fs.String("pod", "", "only this pod's records (NAMESPACE/NAME)")
	all := fs.Bool("all", false, "every record, not only each command's outcome and errors")
	output := fs.String("o", "text", `output format: "text" or "json"`)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "logs: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *output != "text" && *output != "json" {
		fmt.Fprintf(stderr, "logs: -o %q: want text or json\n", *output)
		return 2
	}
	if *pod != "" {
		if _, _, err := ParsePodRef(*pod); err != nil {
			fmt.Fprintf(stderr, "logs: --pod %v\n", err)
			return 2
		}
	}
	from, err := ParseSince(*since, time.Now())
	if err != nil {
		fmt.Fprintf(stderr, "logs: %v\n", err)
		return 2
	}
	path := *file
	if path == "" && *configFile != "" {
		n := &Node{ConfigFile: *configFile}
		cfg, _, err := n.PluginConfig()
		if err != nil {
			fmt.Fprintf(stderr, "logs: %v\n", err)
			return 1
		}
		if path = cfg.LogFile; path == "" {
			fmt.Fprintf(stderr, "logs: the config %s sets log_file to \"\": the plugin writes no log file; its records are in the agent's log (kubectl logs -n %s ds/istio-cni-node)\n", *configFile, agentNamespace())
			return 1
		}
	}
	if path == "" {
		path = filepath.Join(*runDir, plugin.LogFileName)
	}
	f, err := os.Open(path)
	if err != nil {
		fmt.Fprintf(stderr, "logs: %v: the plugin writes it on every ADD/DEL once the istio-cni agent is installed on this node; "+
			"none means the plugin has not run here (is istio-cni in the node's CNI config? run istio-cni-doctor inspect) "+
			"or logs elsewhere (--config, --log-file)\n", err)
		return 1
	}
	defer f.Close()
	recs, skipped, err := ReadLogs(f, LogFilter{Since: from, Pod: *pod, All: *all})
	if err != nil {
		fmt.Fprintf(stderr, "logs: %s: %v\n", path, err)
		return 1
	}
	if recs == nil {
		recs = []LogRecord{}
	}
	if err := write(stdout, *output, recs, func() string { return LogsText(recs) }); err != nil {
		fmt.Fprintf(stderr, "logs: %v\n", err)
		return 1
	}
	if skipped > 0 {
		fmt.Fprintf(stderr, "logs: %d lines of %s are not log records (skipped)\n", skipped, path)
	}
	return 0
}

// defaultRunDir is the agent's run directory: inside the agent pod the chart sets
// CNI_AGENT_RUN_DIR, which may differ from the plugin's default.
func defaultRunDir() string {
	if d := os.Getenv("CNI_AGENT_RUN_DIR"); d != "" {
		return d
	}
	return plugin.DefaultAgentRunDir
}
