package kube

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestAContinuedScalarIsParsedInLinearTime: a plain scalar continued over many
// lines is joined once, not by one concatenation per line (quadratic: a 1 MiB
// kubeconfig took 22 s). Work is measured by bytes allocated, which does not
// depend on the machine's load: joined line by line, the 32,768 lines below
// allocate about 2 GiB; joined once, a few MiB.
func TestAContinuedScalarIsParsedInLinearTime(t *testing.T) {
	const lines = 32 << 10
	doc := "token: a\n" + strings.Repeat("  a\n", lines)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	js, err := yamlToJSON([]byte(doc))
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"token":"a` + strings.Repeat(" a", lines) + `"}`; string(js) != want {
		t.Errorf("got %.80s... (%d bytes), want %.80s... (%d bytes)", js, len(js), want, len(want))
	}
	if allocated, bound := after.TotalAlloc-before.TotalAlloc, 64*uint64(len(doc)); allocated > bound {
		t.Errorf("a %d-byte scalar of %d lines allocated %d MiB to read, more than %d MiB", len(doc), lines+1, allocated>>20, bound>>20)
	}
}

// TestNestingDeeperThanMaxYAMLDepthIsRefused: collections nested up to
// MaxYAMLDepth levels (the top mapping counts as one) are read; one level more is
// refused naming the line and the limit, before the reader recurses further, so
// that a file of "[[[[" costs no deep stack. Flow and block collections count
// alike.
func TestNestingDeeperThanMaxYAMLDepthIsRefused(t *testing.T) {
	// Each builds a document of n nested collections, the innermost on line
	// line(n).
	cases := []struct {
		name string
		doc  func(n int) string
		line func(n int) int
	}{
		{"flow sequences",
			func(n int) string {
				return "apiVersion: v1\npreferences: " + strings.Repeat("[", n-1) + strings.Repeat("]", n-1) + "\n"
			},
			func(int) int { return 2 }},
		{"flow mappings",
			func(n int) string {
				return "apiVersion: v1\npreferences: " + strings.Repeat("{a: ", n-1) + "x" + strings.Repeat("}", n-1) + "\n"
			},
			func(int) int { return 2 }},
		{"block sequences on one line",
			func(n int) string { return "apiVersion: v1\npreferences:\n" + strings.Repeat("- ", n-1) + "x\n" },
			func(int) int { return 3 }},
		{"block mappings",
			func(n int) string {
				var b strings.Builder
				for i := range n {
					fmt.Fprintf(&b, "%sa:\n", strings.Repeat("  ", i))
				}
				return b.String()
			},
			func(n int) int { return n }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			js, err := yamlToJSON([]byte(c.doc(MaxYAMLDepth)))
			if err != nil {
				t.Fatalf("%d levels: %v", MaxYAMLDepth, err)
			}
			if depth := jsonDepth(t, js); depth != MaxYAMLDepth {
				t.Fatalf("%d levels read as JSON nested %d levels: %.200s", MaxYAMLDepth, depth, js)
			}
			_, err = yamlToJSON([]byte(c.doc(MaxYAMLDepth + 1)))
			want := fmt.Sprintf("line %d: collections nested deeper than %d levels", c.line(MaxYAMLDepth+1), MaxYAMLDepth)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("%d levels: got %v, want an error with %q", MaxYAMLDepth+1, err, want)
			}
		})
	}
	t.Run("a whole kubeconfig of [", func(t *testing.T) {
		n := (MaxFileBytes - 100) / 2
		raw := "apiVersion: v1\npreferences: " + strings.Repeat("[", n) + strings.Repeat("]", n) + "\n"
		_, err := ParseKubeconfig([]byte(raw), "/")
		want := fmt.Sprintf("line 2: collections nested deeper than %d levels", MaxYAMLDepth)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("a %d-byte kubeconfig nested %d levels: got %.200v, want an error with %q", len(raw), n+1, err, want)
		}
	})
}

// jsonDepth is the nesting of the JSON js: 1 for a flat object.
func jsonDepth(t *testing.T, js []byte) int {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(string(js)))
	depth, deepest := 0, 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return deepest
		}
		switch tok {
		case json.Delim('['), json.Delim('{'):
			depth++
			deepest = max(deepest, depth)
		case json.Delim(']'), json.Delim('}'):
			depth--
		}
	}
}

// TestThePluginsFilesAreReadOnlyWhenRegular: every file the plugin reads for its
// lookup (the agent's pod file, the kubeconfig and the files it names, the TLS
// session file) is refused at once, naming it, when it is not a regular file: a
// FIFO would block the plugin's open until a writer came, past every bound of the
// ADD. Files reached through symbolic links (a projected token volume's ..data)
// are read as before.
func TestThePluginsFilesAreReadOnlyWhenRegular(t *testing.T) {
	const kubeconfig = "apiVersion: v1\ncurrent-context: x\n" +
		"clusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\"%s}}]\n" +
		"contexts: [{name: x, context: {cluster: c, user: u}}]\n" +
		"users: [{name: u, user: {%s}}]\n"
	write := func(t *testing.T, path, data string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name string
		fifo string // the FIFO's path in the case's directory
		// kubeconfig, when set, is written to kubeconfig in the directory.
		kubeconfig string
		read       func(dir, fifo string) error
	}{
		{name: "the agent's pod file", fifo: filepath.Join(AgentPodFilesDir, "ns_pod.json"), read: func(dir, _ string) error {
			d, err := os.Open(filepath.Join(dir, AgentPodFilesDir))
			if err != nil {
				return err
			}
			defer d.Close()
			release, err := KeepAgentPodFiles(d) // kept, as by a live agent: the file is read
			if err != nil {
				return err
			}
			defer release()
			_, err = ReadAgentPodFile(d.Name(), "ns", "pod")
			return err
		}},
		{name: "the kubeconfig", fifo: "kubeconfig", read: func(_, fifo string) error {
			_, err := LoadKubeconfig(fifo)
			return err
		}},
		{name: "its certificate-authority", fifo: "ca.pem", kubeconfig: fmt.Sprintf(kubeconfig, ", certificate-authority: ca.pem", "token: t"), read: loadKubeconfigIn},
		{name: "its client-key", fifo: "key.pem", kubeconfig: fmt.Sprintf(kubeconfig, "", "client-certificate-data: Q0VSVA==, client-key: key.pem"), read: loadKubeconfigIn},
		{name: "its tokenFile", fifo: "token", kubeconfig: fmt.Sprintf(kubeconfig, "", "tokenFile: token"), read: func(dir, _ string) error {
			kc, err := LoadKubeconfig(filepath.Join(dir, "kubeconfig"))
			if err != nil {
				return err
			}
			_, err = NewClient(kc, time.Second)
			return err
		}},
		{name: "the TLS session file", fifo: "session", read: func(_, fifo string) error {
			_, _, err := NewSessionFile(fifo, &Kubeconfig{Server: "https://127.0.0.1:1"}, "").load()
			return err
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			fifo := filepath.Join(dir, c.fifo)
			if err := os.MkdirAll(filepath.Dir(fifo), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mkfifo(fifo, 0o600); err != nil {
				t.Fatal(err)
			}
			if c.kubeconfig != "" {
				write(t, filepath.Join(dir, "kubeconfig"), c.kubeconfig)
			}
			done := make(chan error, 1)
			go func() { done <- c.read(dir, fifo) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(2 * time.Second):
				// Unblock the reader's open with a writer, which closes at once.
				if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
					f.Close()
				}
				<-done
				t.Fatalf("reading %s, a FIFO, had not returned after 2 s", fifo)
			}
			want := fifo + ": not a regular file (named pipe)"
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("got %v, want an error with %q", err, want)
			}
		})
	}
	t.Run("files reached through symbolic links", func(t *testing.T) {
		// As a projected volume lays them out: token -> ..data/token, ..data -> ..2024_01_01.
		dir := t.TempDir()
		if err := os.Mkdir(filepath.Join(dir, "..2024_01_01"), 0o700); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dir, "..2024_01_01", "token"), "projected-token\n")
		write(t, filepath.Join(dir, "..2024_01_01", "kubeconfig"), fmt.Sprintf(kubeconfig, "", "tokenFile: token"))
		for _, link := range [][2]string{{"..2024_01_01", "..data"}, {"..data/token", "token"}, {"..data/kubeconfig", "kubeconfig"}} {
			if err := os.Symlink(link[0], filepath.Join(dir, link[1])); err != nil {
				t.Fatal(err)
			}
		}
		kc, err := LoadKubeconfig(filepath.Join(dir, "kubeconfig"))
		if err != nil {
			t.Fatal(err)
		}
		c, err := NewClient(kc, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if c.token != "projected-token" {
			t.Errorf("token %q, want the projected file's", c.token)
		}
	})
}

// loadKubeconfigIn loads the kubeconfig in dir.
func loadKubeconfigIn(dir, _ string) error {
	_, err := LoadKubeconfig(filepath.Join(dir, "kubeconfig"))
	return err
}
