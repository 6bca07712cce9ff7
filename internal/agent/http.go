package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// serveHTTP starts the monitoring server (/metrics, plus the probes) and the
// readiness server (/healthz, /readyz); one server when both ports are the same.
// It returns a function that stops them.
func (a *agent) serveHTTP() (stop func(), err error) {
	probes := http.NewServeMux()
	a.probeHandlers(probes)
	monitoring := http.NewServeMux()
	a.probeHandlers(monitoring)
	monitoring.Handle("/metrics", promhttp.HandlerFor(a.m.reg, promhttp.HandlerOpts{
		ErrorLog:            slog.NewLogLogger(a.log.Handler(), slog.LevelError),
		MaxRequestsInFlight: 4,
		Timeout:             10 * time.Second,
	}))

	type server struct {
		what string
		addr netip.Addr
		port uint16
		mux  *http.ServeMux
	}
	servers := []server{{"metrics", a.s.MonitoringAddress, a.s.MonitoringPort, monitoring}}
	if a.s.ReadinessPort != a.s.MonitoringPort || a.s.ReadinessPort == 0 {
		servers = append(servers, server{"probes", a.s.ReadinessAddress, a.s.ReadinessPort, probes})
	}
	var started []*http.Server
	stop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		for _, s := range started {
			_ = s.Shutdown(ctx)
		}
	}
	for _, s := range servers {
		l, err := listen(s.addr, s.port)
		if err != nil {
			stop()
			return nil, portError(s.what, s.addr, s.port, err)
		}
		srv := newHTTPServer(s.mux, a.log)
		started = append(started, srv)
		go func() { _ = srv.Serve(l) }()
		a.log.Info("http server listening", "serves", s.what, "addr", l.Addr().String())
	}
	return stop, nil
}

// The bounds of one connection to the metrics and probe servers, which listen on
// the node's network: reading a request, writing an answer (more than a scrape's
// own 10 s), and waiting for the next request on a kept-alive connection; a client
// that sends nothing more is dropped after httpIdleTimeout instead of holding a
// descriptor and a goroutine for ever.
const (
	httpReadTimeout  = 5 * time.Second
	httpWriteTimeout = 15 * time.Second
	httpIdleTimeout  = 30 * time.Second
)

// newHTTPServer is a server of the node's network with the bounds above. What
// net/http logs (a failed accept, retried while the agent is out of descriptors)
// goes to log, in the agent's format, not to the standard library's logger.
func newHTTPServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: httpReadTimeout, ReadTimeout: httpReadTimeout,
		WriteTimeout: httpWriteTimeout, IdleTimeout: httpIdleTimeout, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError)}
}

func portError(what string, addr netip.Addr, port uint16, err error) error {
	setting, addrSetting := "MONITORING_PORT", "MONITORING_ADDRESS"
	if what == "probes" {
		setting, addrSetting = "READINESS_PORT", "READINESS_ADDRESS"
	}
	var op *net.OpError
	if errors.As(err, &op) {
		err = op.Err
	}
	if addr.IsValid() {
		return fmt.Errorf("%s %d on %s %s: cannot listen: %w", setting, port, addrSetting, addr, err)
	}
	return fmt.Errorf("%s %d: cannot listen: %w", setting, port, err)
}

func (a *agent) probeHandlers(mux *http.ServeMux) {
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		why := a.whyNotReady.Load()
		if why == nil || *why != "" {
			msg := "the agent has not installed the plugin yet"
			if why != nil {
				msg = *why
			}
			http.Error(w, "not ready: "+msg, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
}
