package kube

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

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
	writePodFile(t, dir, webPod)
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
