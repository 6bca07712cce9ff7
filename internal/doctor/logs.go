package doctor

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// LogRecord is one of the plugin's log records (internal/pluginlog writes them as
// JSON lines to <cni_agent_run_dir>/istio-cni.log). Fields the plugin adds that are
// not listed here are kept in Extra.
type LogRecord struct {
	Time        time.Time      `json:"time"`
	Level       string         `json:"level"`
	Msg         string         `json:"msg"`
	Command     string         `json:"command,omitempty"`
	Pod         string         `json:"pod,omitempty"`
	ContainerID string         `json:"containerID,omitempty"`
	Netns       string         `json:"netns,omitempty"`
	Decision    string         `json:"decision,omitempty"`
	Reason      string         `json:"reason,omitempty"`
	Backend     string         `json:"backend,omitempty"`
	Error       string         `json:"error,omitempty"`
	Took        LogDuration    `json:"took,omitempty"`
	Extra       map[string]any `json:"extra,omitempty"`
}

// LogDuration reads a duration as slog's JSON handler writes it (nanoseconds) or
// as text ("1.5s"), and writes it as text.
type LogDuration time.Duration

func (d *LogDuration) UnmarshalJSON(b []byte) error {
	var ns int64
	if err := json.Unmarshal(b, &ns); err == nil {
		*d = LogDuration(ns)
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	*d = LogDuration(v)
	return err
}

func (d LogDuration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// LogFilter selects records.
type LogFilter struct {
	Since time.Time
	// Pod is NAMESPACE/NAME; empty means every pod.
	Pod string
	// All keeps progress and debug records too; by default only the outcome of
	// each command (and every error) is kept.
	All bool
}

// isOutcome reports whether a record is the outcome of a command, as the agent's
// counters classify them (internal/agent): ADD redirected or passed through, any
// error, DEL done, CHECK failed.
func (r *LogRecord) isOutcome() bool {
	return r.Level == "ERROR" || r.Level == "WARN" ||
		strings.HasPrefix(r.Msg, "ADD: ") || strings.HasPrefix(r.Msg, "DEL: ")
}

// ReadLogs reads the plugin's log records and keeps those the filter selects, in
// time order. Lines that are not records (a truncated last line) are counted, not
// fatal: the file is appended to by concurrent plugin processes.
func ReadLogs(r io.Reader, f LogFilter) (recs []LogRecord, skipped int, err error) {
	podOf := map[string]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var raw map[string]any
		if json.Unmarshal([]byte(line), &raw) != nil {
			skipped++
			continue
		}
		var rec LogRecord
		if json.Unmarshal([]byte(line), &rec) != nil || rec.Msg == "" {
			skipped++
			continue
		}
		known := map[string]bool{"time": true, "level": true, "msg": true, "command": true, "pod": true, "containerID": true,
			"netns": true, "decision": true, "reason": true, "backend": true, "error": true, "took": true}
		for k, v := range raw {
			if !known[k] {
				if rec.Extra == nil {
					rec.Extra = map[string]any{}
				}
				rec.Extra[k] = v
			}
		}
		// DEL records carry no pod (the runtime passes none it must trust): they
		// belong to the pod whose ADD had the same container.
		if rec.Pod != "" && rec.ContainerID != "" {
			podOf[rec.ContainerID] = rec.Pod
		} else if rec.Pod == "" {
			rec.Pod = podOf[rec.ContainerID]
		}
		if rec.Time.Before(f.Since) || f.Pod != "" && rec.Pod != f.Pod || !f.All && !rec.isOutcome() {
			continue
		}
		recs = append(recs, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, skipped, fmt.Errorf("read plugin log: %w", err)
	}
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].Time.Before(recs[j].Time) })
	return recs, skipped, nil
}

// LogsText renders records one per line, for people.
func LogsText(recs []LogRecord) string {
	var b strings.Builder
	if len(recs) == 0 {
		b.WriteString("no matching plugin records\n")
	}
	for _, r := range recs {
		cmd := r.Command
		if cmd == "" {
			cmd = "-"
		}
		pod := r.Pod
		if pod == "" {
			pod = "-"
		}
		fmt.Fprintf(&b, "%s  %-5s %-5s %s  %s", r.Time.UTC().Format(time.RFC3339), cmd, r.Level, pod, describeRecord(r))
		if r.ContainerID != "" {
			fmt.Fprintf(&b, "  [container %s]", r.ContainerID)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func describeRecord(r LogRecord) string {
	var s string
	switch {
	case strings.HasPrefix(r.Msg, "ADD: traffic redirected"):
		s = "redirected to the sidecar"
		if r.Backend != "" {
			s += " (" + r.Backend + ")"
		}
	case strings.HasPrefix(r.Msg, "ADD: pod passed through"):
		s = fmt.Sprintf("NOT redirected: rule %s: %s", r.Decision, r.Reason)
	case r.Error != "":
		s = fmt.Sprintf("%s: %s", strings.TrimSuffix(r.Msg, "."), r.Error)
	default:
		s = r.Msg
		if r.Reason != "" {
			s += ": " + r.Reason
		}
	}
	if r.Took != 0 {
		s += ", took " + time.Duration(r.Took).Round(time.Microsecond).String()
	}
	keys := make([]string, 0, len(r.Extra))
	for k := range r.Extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var extra []string
	for _, k := range keys {
		if k == "applyTook" || k == "lookupTook" || k == "phases" || k == "ipv6" {
			continue // timings and flags: in -o json
		}
		extra = append(extra, fmt.Sprintf("%s=%v", k, r.Extra[k]))
	}
	if len(extra) > 0 {
		s += " (" + strings.Join(extra, " ") + ")"
	}
	return s
}

// ParseSince reads --since: a duration back from now, or an RFC 3339 time.
func ParseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("--since %s: negative", s)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("--since %q: want a duration (1h, 30m) or an RFC 3339 time", s)
	}
	return t, nil
}
