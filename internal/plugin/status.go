package plugin

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/istio-cni/istio-cni/internal/cnicmd"
	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/pluginlog"
	"github.com/istio-cni/istio-cni/internal/regularfile"
)

// NotReadyStateName is the file in the run directory that holds why STATUS last
// found the plugin not ready, from the moment it found so (the file's time); there
// is none while the plugin is ready. The runtime runs STATUS every few seconds
// (the kubelet asks the runtime's status every 5 s, and containerd 2.x runs STATUS
// for each of them): with it, a node whose agent is down logs the cause once, not
// 17,000 times a day.
const NotReadyStateName = "istio-cni-not-ready"

// maxNotReadyState bounds what is read of NotReadyStateName; a reason is a line.
const maxNotReadyState = 64 << 10

// Status reports whether the plugin can work on this node. A runtime that calls
// STATUS (containerd 2.x, for a config list of CNI 1.1.0) reports its failure as
// NetworkReady=false, which makes the kubelet mark the node NotReady; so it fails
// only when every ADD outside the excluded namespaces would fail closed: the
// plugin's config is invalid, or its kubeconfig is missing, unreadable or invalid.
// It never calls the API server: a slow or unreachable API server fails (or
// delays, within their bound) the ADDs that need it, not the node's readiness.
//
// A failure is the spec's STATUS error 50, "the plugin is not available": pods
// already set up keep their capture, so it is never 51. It is logged when the
// plugin's state changes (ready, not ready, or not ready for another reason),
// at debug level otherwise (see NotReadyStateName).
func (p *Plugin) Status(args *cnicmd.CmdArgs) error {
	cfg, cfgErr := ParseConfig(args.StdinData)
	var log *pluginlog.Logger
	var runDir, reason string
	if cfgErr != nil {
		// Where the agent looks, as far as the config says (see invalidConfigPaths).
		runDir, _ = invalidConfigPaths(args.StdinData)
		log = pluginlog.New(p.Stderr, invalidConfigLogOptions(args.StdinData))
		reason = cfgErr.Error()
	} else {
		runDir = cfg.AgentRunDir
		log = pluginlog.New(p.Stderr, cfg.logOptions())
		if p.StartErr != nil {
			log.Debug("at the process's start", "error", p.StartErr)
		}
		rememberIptablesVersion(cfg, log)
		reason = kubeconfigProblem(cfg)
	}
	defer log.Close()
	logStatusChange(log.With("command", "STATUS"), filepath.Join(runDir, NotReadyStateName), reason, cfg)
	if reason != "" {
		return types.NewError(types.ErrPluginNotAvailable, reason, "")
	}
	return nil
}

// kubeconfigProblem is why the plugin cannot look pods up with cfg's kubeconfig,
// "" when it can (as far as can be known without the API server).
func kubeconfigProblem(cfg *Config) string {
	kc, err := cfg.loadKubeconfig()
	if err == nil {
		_, err = kube.NewClient(kc, time.Second)
	}
	if err != nil {
		return fmt.Sprintf("istio-cni cannot look pods up: %v (is the istio-cni node agent running on this node?)", err)
	}
	return ""
}

// notReadyMsg is the record of STATUS finding the plugin not ready.
const notReadyMsg = "STATUS: not ready: the runtime reports the node's network not ready (the node NotReady) until this is fixed; logged again when the reason changes"

// logStatusChange logs STATUS's finding, reason ("" for ready), once per change:
// the file at state holds the last reason found. Where it cannot be read or
// written, each not ready finding is logged, as before there was one.
func logStatusChange(log *slog.Logger, state, reason string, cfg *Config) {
	ready := func() {
		if cfg != nil {
			log.Debug("STATUS: ready", "kubeconfig", cfg.Kubeconfig)
		}
	}
	prev, since, err := readNotReady(state)
	switch {
	case err != nil && reason == "":
		ready()
	case err != nil:
		log.Warn(notReadyMsg, "error", reason, "stateNotRecorded", err)
	case reason == "" && prev == "":
		ready()
	case reason == "":
		attrs := []any{"notReadyFor", time.Since(since).Round(time.Second), "was", prev}
		if err := os.Remove(state); err != nil && !errors.Is(err, fs.ErrNotExist) {
			attrs = append(attrs, "stateNotRecorded", err)
		}
		log.Info("STATUS: ready again", attrs...)
	case reason == prev:
		log.Debug("STATUS: not ready, as before", "error", reason, "since", since.UTC().Format(time.RFC3339))
	default:
		attrs := []any{"error", reason}
		if err := writeNotReady(state, reason); err != nil {
			attrs = append(attrs, "stateNotRecorded", err)
		}
		log.Warn(notReadyMsg, attrs...)
	}
}

// readNotReady reads the reason recorded at path and since when it holds; "" and
// no error when nothing is recorded (ready).
func readNotReady(path string) (reason string, since time.Time, err error) {
	data, err := regularfile.ReadBounded(path, maxNotReadyState)
	if errors.Is(err, fs.ErrNotExist) {
		return "", time.Time{}, nil
	}
	if err != nil {
		return "", time.Time{}, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return "", time.Time{}, err
	}
	return string(data), fi.ModTime(), nil
}

// writeNotReady records reason at path. Written in place: a concurrent STATUS
// (the runtime runs one per network) that reads it half written logs the reason
// once more and writes it again, which is all a torn read costs.
func writeNotReady(path, reason string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := regularfile.Open(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(reason)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
