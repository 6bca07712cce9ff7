package agent

import (
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/internal/kube"
)

// bundle is a CA file of about size bytes: copies of one certificate.
func bundle(t *testing.T, size int) []byte {
	one := testCA(t)
	return bytes.Repeat(one, size/len(one)+1)
}

// TestKubeconfigOverThePluginsLimitIsRefusedNamingTheCAFile: the CA goes inline in
// base64 (4/3 of its size), so a CA file well under kube.MaxFileBytes can make a
// kubeconfig over it, which the plugin would refuse on every lookup. The agent
// refuses to render it, naming the CA file and its size; one just under the limit
// is rendered and read by the plugin's loader.
func TestKubeconfigOverThePluginsLimitIsRefusedNamingTheCAFile(t *testing.T) {
	s := mustParse(t, map[string]string{"SERVICE_ACCOUNT_DIR": "/sa"})
	for _, tc := range []struct {
		name  string
		ca    []byte
		wants []string // substrings of the error; none: rendered and read
	}{
		{"a 600 KiB CA fits", bundle(t, 600<<10), nil},
		{"an 800 KiB CA does not", bundle(t, 800<<10), []string{"CA file /sa/ca.crt", "bytes",
			"over the plugin's limit of " + strconv.Itoa(kube.MaxFileBytes)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := Kubeconfig(&s, []byte("token"), tc.ca)
			if tc.wants != nil {
				if err == nil {
					t.Fatalf("a %d-byte CA file gave a %d-byte kubeconfig; want it refused", len(tc.ca), len(data))
				}
				for _, want := range append(tc.wants, strconv.Itoa(len(tc.ca))) {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q, want it to contain %q", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("a %d-byte CA file: %v", len(tc.ca), err)
			}
			path := filepath.Join(t.TempDir(), "istio-cni-kubeconfig")
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := kube.LoadKubeconfig(path); err != nil {
				t.Errorf("the plugin refuses the %d-byte kubeconfig: %v", len(data), err)
			}
		})
	}
}

// TestKubeconfigStepStaysNotReadyWithAnOversizedCA: the install step refuses it,
// writes nothing and keeps the agent not ready, with the reason in its log.
func TestKubeconfigStepStaysNotReadyWithAnOversizedCA(t *testing.T) {
	sa := t.TempDir()
	writeFile(t, filepath.Join(sa, "token"), []byte("token"), 0o600)
	writeFile(t, filepath.Join(sa, "ca.crt"), bundle(t, 800<<10), 0o644)
	s := mustParse(t, map[string]string{"SERVICE_ACCOUNT_DIR": sa})
	s.RunDir = t.TempDir()
	var log bytes.Buffer
	a := newAgent(&s, slog.New(slog.NewTextHandler(&log, nil)))
	a.kubeOK = true
	a.reconcileKubeconfig()
	if a.kubeOK {
		t.Error("the agent counts the kubeconfig step done")
	}
	if _, err := os.Stat(s.KubeconfigPath()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("kubeconfig written (stat: %v)", err)
	}
	if !strings.Contains(log.String(), "CA file "+filepath.Join(sa, "ca.crt")) {
		t.Errorf("the log does not name the CA file:\n%s", log.String())
	}
}

// TestCredentialsAreReadBoundedAndOnlyFromRegularFiles: the token and the CA are
// read through a bound (kube.MaxFileBytes, the plugin's own limit per file), and a
// FIFO or a directory in their place is refused at once instead of blocking the
// agent's loop or reading without end.
func TestCredentialsAreReadBoundedAndOnlyFromRegularFiles(t *testing.T) {
	big := bytes.Repeat([]byte("a"), kube.MaxFileBytes+1)
	cases := []struct {
		name  string
		setup func(t *testing.T, path string)
		file  string
		want  string
	}{
		{"a token over the limit", func(t *testing.T, p string) { writeFile(t, p, big, 0o600) }, "token",
			"larger than " + strconv.Itoa(kube.MaxFileBytes) + " bytes"},
		{"a CA over the limit", func(t *testing.T, p string) { writeFile(t, p, big, 0o644) }, "ca.crt",
			"larger than " + strconv.Itoa(kube.MaxFileBytes) + " bytes"},
		{"a FIFO as the token", mkfifo, "token", "not a regular file"},
		{"a FIFO as the CA", mkfifo, "ca.crt", "not a regular file"},
		{"a directory as the CA", func(t *testing.T, p string) {
			if err := os.Mkdir(p, 0o755); err != nil {
				t.Fatal(err)
			}
		}, "ca.crt", "not a regular file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sa := t.TempDir()
			writeFile(t, filepath.Join(sa, "token"), []byte("token"), 0o600)
			writeFile(t, filepath.Join(sa, "ca.crt"), testCA(t), 0o644)
			path := filepath.Join(sa, tc.file)
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			tc.setup(t, path)
			s := mustParse(t, map[string]string{"SERVICE_ACCOUNT_DIR": sa})
			done := make(chan error, 1)
			go func() { _, _, err := readCredentials(&s); done <- err }()
			var err error
			select {
			case err = <-done:
			case <-time.After(3 * time.Second):
				// Unblock the reader: a writer opens the FIFO and closes it.
				if f, ferr := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); ferr == nil {
					f.Close()
				}
				t.Fatalf("reading the credentials still blocks after 3 s on %s", tc.file)
			}
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one naming %s and containing %q", err, path, tc.want)
			}
		})
	}
	// The projected token is a symbolic link to a regular file: read.
	sa := t.TempDir()
	writeFile(t, filepath.Join(sa, "real-token"), []byte("token"), 0o600)
	writeFile(t, filepath.Join(sa, "ca.crt"), testCA(t), 0o644)
	if err := os.Symlink("real-token", filepath.Join(sa, "token")); err != nil {
		t.Fatal(err)
	}
	s := mustParse(t, map[string]string{"SERVICE_ACCOUNT_DIR": sa})
	if token, _, err := readCredentials(&s); err != nil || string(token) != "token" {
		t.Errorf("a token behind a symbolic link: %q, %v", token, err)
	}
}

func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
}
