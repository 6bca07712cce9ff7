package kube

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// keepPodFiles makes dir and holds its lock as the agent does, until the test ends.
func keepPodFiles(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	release, err := KeepAgentPodFiles(d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
}

// writePodFile writes content as the file of app/web in dir.
func writePodFile(t *testing.T, dir, content string) {
	t.Helper()
	path, _ := AgentPodFile(dir, "app", "web")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

const webPod = `{"metadata":{"name":"web","namespace":"app","uid":"u1","annotations":{"traffic.sidecar.istio.io/excludeInboundPorts":"8081"}}}`

// podFilesHolderEnv makes the test binary a process that holds the pod files' lock
// of the directory it names, as an agent does, until it is killed.
const podFilesHolderEnv = "KUBE_TEST_POD_FILES_HOLDER"

// TestAPodFilesHolder is the process TestAgentPodFilesAreReadOnlyWhileTheirKeeperLives
// starts; run alone it does nothing.
func TestAPodFilesHolder(t *testing.T) {
	dir := os.Getenv(podFilesHolderEnv)
	if dir == "" {
		return
	}
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := KeepAgentPodFiles(d); err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("holding\n")
	time.Sleep(time.Hour)
}

// TestAgentPodFilesAreReadOnlyWhileTheirKeeperLives: the files of a directory are
// read only while a process holds its lock, as the agent keeping them does: not
// before (no lock file, or one no one holds: an earlier agent's directory, a node
// rebooted with a run directory on disk), and not once that process is killed with
// SIGKILL (the kernel drops its lock; its files stay, unchanged, and an annotation
// changed since would be missed). A second keeper of the same directory is refused.
func TestAgentPodFilesAreReadOnlyWhileTheirKeeperLives(t *testing.T) {
	dir := filepath.Join(t.TempDir(), AgentPodFilesDir)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	content, err := EncodeAgentPodFile([]byte(webPod))
	if err != nil {
		t.Fatal(err)
	}
	writePodFile(t, dir, string(content))
	read := func() error { _, err := ReadAgentPodFile(dir, "app", "web"); return err }
	if err := read(); !errors.Is(err, ErrPodFilesNotKept) {
		t.Errorf("no lock file: %v, want %v", err, ErrPodFilesNotKept)
	}
	lock := filepath.Join(dir, AgentPodFilesLock)
	if err := syscall.Mkfifo(lock, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := read(); !errors.Is(err, ErrPodFilesNotKept) { // and at once: the open does not wait for a writer
		t.Errorf("a FIFO in the lock's place: %v, want %v", err, ErrPodFilesNotKept)
	}
	if err := os.Remove(lock); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := read(); !errors.Is(err, ErrPodFilesNotKept) {
		t.Errorf("a lock file no one holds: %v, want %v", err, ErrPodFilesNotKept)
	}

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	holder := exec.CommandContext(ctx, self, "-test.run=^TestAPodFilesHolder$")
	holder.Env = append(os.Environ(), podFilesHolderEnv+"="+dir)
	holder.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Wait()
	defer holder.Process.Kill()
	if line, err := bufio.NewReader(out).ReadString('\n'); line != "holding\n" {
		t.Fatalf("the holder said %q (%v)", line, err)
	}
	if err := read(); err != nil {
		t.Errorf("a live process holds the lock: %v, want the pod", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if release, err := KeepAgentPodFiles(d); err == nil {
		release()
		t.Error("KeepAgentPodFiles took the lock another live process holds")
	}

	if err := holder.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	holder.Wait()
	if err := read(); !errors.Is(err, ErrPodFilesNotKept) {
		t.Errorf("the holder was killed with SIGKILL: %v, want %v", err, ErrPodFilesNotKept)
	}
	if _, err := os.Stat(filepath.Join(dir, "app_web.json")); err != nil {
		t.Errorf("the killed holder's file: %v, want it still there (only not read)", err)
	}

	// This process keeps them now (a lock of its own open file description is
	// seen as any other process's), then releases them.
	release, err := KeepAgentPodFiles(d)
	if err != nil {
		t.Fatal(err)
	}
	if err := read(); err != nil {
		t.Errorf("kept by this process: %v, want the pod", err)
	}
	release()
	if err := read(); !errors.Is(err, ErrPodFilesNotKept) {
		t.Errorf("released: %v, want %v", err, ErrPodFilesNotKept)
	}
}

// TestAgentPodFilesOfAnotherFormatVersionAreNotRead: a kept file is read only when it
// holds this build's format version (the last of the member given twice, as
// encoding/json reads it); a file of another version, or of none (an agent of a
// build before versions, writing into this agent's directory during an upgrade),
// is refused, naming the version seen. EncodeAgentPodFile's output reads back as
// the pod.
func TestAgentPodFilesOfAnotherFormatVersionAreNotRead(t *testing.T) {
	dir := filepath.Join(t.TempDir(), AgentPodFilesDir)
	keepPodFiles(t, dir)
	encoded, err := EncodeAgentPodFile([]byte(webPod))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"podFileVersion":1,"metadata":`; !strings.HasPrefix(string(encoded), want) {
		t.Errorf("EncodeAgentPodFile = %s, want it to start %s", encoded, want)
	}
	body := strings.TrimPrefix(webPod, "{")
	for _, tc := range []struct {
		name, file string
		wantSeen   string // "": read
	}{
		{"encoded", string(encoded), ""},
		{"version 1 last", `{"podFileVersion":2,` + strings.TrimSuffix(body, "}") + `,"podFileVersion":1}`, ""},
		{"no version", webPod, "format version none"},
		{"version 2", `{"podFileVersion":2,` + body, `format version "2"`},
		{"version 0", `{"podFileVersion":0,` + body, `format version "0"`},
		{"a string", `{"podFileVersion":"1",` + body, `format version "\"1\""`},
		{"a fraction", `{"podFileVersion":1.0,` + body, `format version "1.0"`},
		{"null", `{"podFileVersion":null,` + body, `format version "null"`},
		{"another case", `{"PodFileVersion":1,` + body, "format version none"},
		{"version 2 last", `{"podFileVersion":1,` + strings.TrimSuffix(body, "}") + `,"podFileVersion":2}`, `format version "2"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			writePodFile(t, dir, tc.file)
			pod, err := ReadAgentPodFile(dir, "app", "web")
			if tc.wantSeen == "" {
				if err != nil || pod.Metadata.UID != "u1" || pod.Metadata.Annotations["traffic.sidecar.istio.io/excludeInboundPorts"] != "8081" {
					t.Errorf("ReadAgentPodFile = %+v, %v; want the pod", pod, err)
				}
				return
			}
			if !errors.Is(err, ErrPodFileVersion) || !strings.Contains(err.Error(), tc.wantSeen+", this plugin reads 1") {
				t.Errorf("ReadAgentPodFile = %+v, %v; want %v naming %s", pod, err, ErrPodFileVersion, tc.wantSeen)
			}
		})
	}
}

// TestEncodeAgentPodFile puts the version first in any JSON object, and refuses
// what is not one.
func TestEncodeAgentPodFile(t *testing.T) {
	for in, want := range map[string]string{
		`{}`:        `{"podFileVersion":1}`,
		`{ }`:       `{"podFileVersion":1 }`,
		`{"a":1}`:   `{"podFileVersion":1,"a":1}`,
		`{"a":[1]}`: `{"podFileVersion":1,"a":[1]}`,
	} {
		got, err := EncodeAgentPodFile([]byte(in))
		if diff := cmp.Diff(want, string(got)); diff != "" || err != nil {
			t.Errorf("EncodeAgentPodFile(%s) (-want +got), %v:\n%s", in, err, diff)
		}
	}
	for _, in := range []string{``, `null`, `[1]`, `"{}"`, `{`} {
		if got, err := EncodeAgentPodFile([]byte(in)); err == nil {
			t.Errorf("EncodeAgentPodFile(%q) = %s, want an error", in, got)
		}
	}
}

// TestAPluginBeforeFormatVersionsReadsTheNewFiles: a plugin of a build before
// format versions (the plugin binary is replaced a moment after the new agent
// starts writing, or an older agent is rolled back to beside a newer plugin's
// files) decodes a pod file with decodePod alone, which passes over members a pod
// does not have: it reads the versioned file as the pod, as before.
func TestAPluginBeforeFormatVersionsReadsTheNewFiles(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "plugin", "testdata", "pods", "traffic-annotations.json"))
	if err != nil {
		t.Fatal(err)
	}
	pod := []byte(strings.TrimSpace(string(data)))
	encoded, err := EncodeAgentPodFile(pod)
	if err != nil {
		t.Fatal(err)
	}
	var before, after Pod
	if err := decodePod(pod, &before); err != nil {
		t.Fatal(err)
	}
	if err := decodePod(encoded, &after); err != nil {
		t.Fatalf("the earlier plugin's decode of a versioned file: %v", err)
	}
	if diff := cmp.Diff(before, after); diff != "" || before.Metadata.UID == "" {
		t.Errorf("the earlier plugin's decode of the versioned file (-unversioned +versioned):\n%s", diff)
	}
}
