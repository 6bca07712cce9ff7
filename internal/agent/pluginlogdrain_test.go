package agent

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/istio-cni/istio-cni/internal/plugin"
	"github.com/istio-cni/istio-cni/internal/pluginlog"
	"github.com/istio-cni/istio-cni/test/harness/logbuf"
	"github.com/istio-cni/istio-cni/test/harness/nofile"
	"github.com/istio-cni/istio-cni/test/harness/poll"
	"github.com/istio-cni/istio-cni/test/harness/shortdir"
)

// gatedWriter holds every write until open is closed: the agent's stdout stuck for
// a moment, so that plugin records pile up in the sockets' queues.
type gatedWriter struct {
	open chan struct{}
	out  logbuf.Buffer
}

func (g *gatedWriter) Write(p []byte) (int, error) {
	<-g.open
	return g.out.Write(p)
}

// TestStopReadsWhatPluginsSentBefore: when the agent stops, the records plugins
// sent before reach its stdout: those of connections still in the socket's accept
// queue (a plugin's connect succeeds once the kernel queues it, and its records
// wait there), of connections being served, and the datagrams queued. Before, stop
// closed the listener and every connection at once, and all of them were lost. A
// plugin whose connection stays open (its ADD still running) costs the stop
// PluginLogDrainBound at most; its records sent before are printed too.
func TestStopReadsWhatPluginsSentBefore(t *testing.T) {
	dir := shortdir.New(t)
	packet, dgram := filepath.Join(dir, plugin.LogSocketName), filepath.Join(dir, plugin.DatagramLogSocketName)
	gate := &gatedWriter{open: make(chan struct{})}
	sink := &pluginLogSink{out: gate, m: newMetrics()}
	stop, err := servePluginLogs(packet, dgram, sink, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	var release sync.Once
	openGate := func() { release.Do(func() { close(gate.open) }) }
	defer openGate() // a failure below lets a stuck stop return

	// Every slot taken by a served connection whose reader waits on stdout, so the
	// next ones stay queued, unaccepted.
	const served, queued, datagrams = MaxPluginConns, 20, 5
	send := func(network, msg string, closeAfter bool) net.Conn {
		t.Helper()
		c, err := net.Dial(network, map[string]string{"unixpacket": packet, "unixgram": dgram}[network])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte(fmt.Sprintf(`{"level":"INFO","msg":%q}`, msg))); err != nil {
			t.Fatal(err)
		}
		if closeAfter {
			c.Close()
		}
		return c
	}
	var want []string
	for i := range served {
		want = append(want, fmt.Sprintf("served-%d", i))
		send("unixpacket", want[len(want)-1], true)
	}
	poll.Until(t, 10*time.Second, time.Millisecond, "every slot's reader holds its record", func() bool {
		return gathered(t, sink.m, "istio_cni_plugin_log_records_total", "protocol", protocolSeqpacket) == served
	})
	open := send("unixpacket", "sent by a plugin still running", false)
	defer open.Close()
	want = append(want, "sent by a plugin still running")
	for i := range queued {
		want = append(want, fmt.Sprintf("queued-%d", i))
		send("unixpacket", want[len(want)-1], true)
	}
	dg := send("unixgram", "datagram-0", false)
	want = append(want, "datagram-0")
	for i := 1; i < datagrams; i++ {
		want = append(want, fmt.Sprintf("datagram-%d", i))
		if _, err := dg.Write([]byte(fmt.Sprintf(`{"level":"INFO","msg":"datagram-%d"}`, i))); err != nil {
			t.Fatal(err)
		}
	}
	dg.Close()

	stopped := make(chan time.Duration, 1)
	began := time.Now()
	go func() {
		stop(time.Now().Add(PluginLogDrainBound))
		stopped <- time.Since(began)
	}()
	for wait := time.Now().Add(2 * time.Second); !pathGone(packet) || !pathGone(dgram); time.Sleep(time.Millisecond) {
		if time.Now().After(wait) {
			t.Errorf("stop did not remove the sockets first: plugins could still connect while it read what was queued")
			break
		}
	}
	openGate()
	var took time.Duration
	select {
	case took = <-stopped:
	case <-time.After(PluginLogDrainBound + 5*time.Second):
		t.Fatalf("stop did not return within %s of its bound", 5*time.Second)
	}
	if took > PluginLogDrainBound+time.Second {
		t.Errorf("stop took %s, more than its bound %s (and 1 s)", took, PluginLogDrainBound)
	}
	lines := gate.out.String()
	var lost []string
	for _, msg := range want {
		if !strings.Contains(lines, fmt.Sprintf(`"msg":%q`, msg)) {
			lost = append(lost, msg)
		}
	}
	if len(lost) > 0 {
		t.Errorf("%d of %d records sent before the stop are not on the agent's stdout: %v", len(lost), len(want), lost)
	}
	if _, err := open.Write([]byte(`{"msg":"after"}`)); err == nil {
		t.Errorf("the plugin still running could write to its connection after the stop")
	}
}

// TestStopAnswersIstiosPostsInTheQueue: a post of Istio's plugin whose connection
// waits in the queue of Istio's log socket when the agent stops is accepted and
// printed. Here it waits because the agent is out of file descriptors when it
// connects, and stays out until the stop has begun; before, stop closed the
// listener and the post was lost.
func TestStopAnswersIstiosPostsInTheQueue(t *testing.T) {
	dir := shortdir.New(t)
	path := filepath.Join(dir, plugin.IstioLogSocketName)
	var out logbuf.Buffer
	sink := &pluginLogSink{out: &out, m: newMetrics()}
	stop, err := serveIstioPluginLogs(path, sink, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	body := `["{\"level\":\"info\",\"msg\":\"posted while the agent stopped\"}"]`
	post := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: unix\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", pluginlog.IstioLogPath, len(body), body)
	client := nofile.NewSocket(t, syscall.AF_UNIX, syscall.SOCK_STREAM)
	release := nofile.Exhaust(t, 0)
	if err := client.Connect(&syscall.SockaddrUnix{Name: path}); err != nil {
		release()
		t.Fatal(err)
	}
	if err := client.Write([]byte(post)); err != nil {
		release()
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() {
		stop(time.Now().Add(PluginLogDrainBound))
		close(stopped)
	}()
	for !pathGone(path) {
		time.Sleep(time.Millisecond)
	}
	release()
	select {
	case <-stopped:
	case <-time.After(PluginLogDrainBound + 5*time.Second):
		t.Fatal("stop did not return")
	}
	if !strings.Contains(out.String(), "posted while the agent stopped") {
		t.Errorf("the queued post is not on the agent's stdout:\n%s", out.String())
	}
	if _, err := os.Lstat(path); err == nil {
		t.Errorf("stop left its socket")
	}
}
