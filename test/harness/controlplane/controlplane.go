package controlplane

import (
	"github.com/istio-cni/istio-cni/test/harness/childproc"
	"net/netip"

	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Options configure Start. The zero value is a working configuration.
type Options struct {
	// BinDir holds etcd and kube-apiserver. Empty: $KUBE_BIN_DIR, else the directory
	// printed by hack/kube-binaries.sh, run from the repository root (building the
	// binaries on its first run).
	BinDir string
	// BuildOutput receives hack/kube-binaries.sh's progress. Nil: os.Stderr.
	BuildOutput io.Writer
	// TempDir is where the control plane's own temporary directory is made.
	// Empty: os.TempDir().
	TempDir string
	// AdvertiseAddress is the apiserver's --advertise-address. Empty: the first
	// IPv4 address of an up, non-loopback interface (a loopback address breaks
	// the "kubernetes" service endpoints).
	AdvertiseAddress net.IP
	// BindAddress is the apiserver's --bind-address, and the address its URL
	// (Host, kubeconfigs) names. Empty: 127.0.0.1. A node with kube-proxy binds
	// the advertised address, where the kubernetes Service's endpoint leads.
	BindAddress net.IP
	// StartTimeout bounds the wait for etcd and the apiserver to become ready.
	// Zero: 90s, which leaves room for a busy two-core machine.
	StartTimeout time.Duration
	// ExtraAPIServerArgs are appended to the apiserver's flags; for a scalar flag
	// the last value wins, so these override the defaults.
	ExtraAPIServerArgs []string
	// Logger receives progress. Nil: slog.Default().
	Logger *slog.Logger
}

// ServiceClusterIPRange is the apiserver's --service-cluster-ip-range.
const ServiceClusterIPRange = "10.96.0.0/16"

// ControlPlane is a running etcd and kube-apiserver. Stop it when done.
type ControlPlane struct {
	dir       string // removed by Stop
	host      string
	caData    []byte
	keys      *pki
	adminKC   string
	adminCfg  *rest.Config
	admin     kubernetes.Interface
	etcd      *childproc.Process
	apiserver *childproc.Process
	launcher  *childproc.Launcher
	// apiBin and apiArgs start the apiserver again (StartAPIServer); apiMu guards
	// apiserver, which StopAPIServer and StartAPIServer replace.
	apiBin     string
	apiArgs    []string
	etcdURL    string // its client URL (AdvanceRevision)
	apiMu      sync.Mutex
	log        *slog.Logger
	startupDur time.Duration

	stopOnce sync.Once
	stopErr  error
}

// Host is the apiserver's URL (https://127.0.0.1:PORT).
func (c *ControlPlane) Host() string { return c.host }

// CAData is the PEM certificate of the CA that signed the apiserver's serving
// certificate and every client certificate.
func (c *ControlPlane) CAData() []byte { return append([]byte(nil), c.caData...) }

// AdminKubeconfig is the path of a kubeconfig whose client certificate is in
// system:masters.
func (c *ControlPlane) AdminKubeconfig() string { return c.adminKC }

// AdminRESTConfig is a client configuration with the same access as
// AdminKubeconfig.
func (c *ControlPlane) AdminRESTConfig() *rest.Config { return rest.CopyConfig(c.adminCfg) }

// AdminClient is a clientset with the same access as AdminKubeconfig.
func (c *ControlPlane) AdminClient() kubernetes.Interface { return c.admin }

// Dir is the control plane's temporary directory (certificates, kubeconfigs, etcd
// data, logs). Stop removes it.
func (c *ControlPlane) Dir() string { return c.dir }

// LogPaths are the log files of etcd and kube-apiserver, by name. They are gone after
// Stop.
func (c *ControlPlane) LogPaths() map[string]string {
	return map[string]string{c.etcd.Name: c.etcd.LogPath, c.apiserver.Name: c.apiserver.LogPath}
}

// StartupDuration is how long Start took, binaries excluded.
func (c *ControlPlane) StartupDuration() time.Duration { return c.startupDur }

// errPortTaken marks a start that failed because another process grabbed a port
// between our probe and the server's bind; Start retries those.
var errPortTaken = errors.New("port taken")

// Start runs etcd and kube-apiserver and returns once the apiserver's /readyz is
// ok. ctx bounds only the start: the servers run until Stop.
func Start(ctx context.Context, opts Options) (*ControlPlane, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	binDir, err := locateBinaries(ctx, opts)
	if err != nil {
		return nil, err
	}
	advertise := opts.AdvertiseAddress
	if advertise == nil {
		a, err := NonLoopbackIPv4()
		if err != nil {
			return nil, fmt.Errorf("%w for --advertise-address; set Options.AdvertiseAddress", err)
		}
		advertise = a.AsSlice()
	}
	timeout := opts.StartTimeout
	if timeout == 0 {
		timeout = 90 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	// Free ports are found by binding and closing; another process may take one in
	// between. That race is rare and shows up as a bind error, so retry a few times.
	const attempts = 3
	for i := 1; ; i++ {
		began := time.Now()
		cp, err := start(ctx, opts, log, binDir, advertise)
		if err == nil {
			cp.startupDur = time.Since(began)
			log.Info("control plane ready", "host", cp.host, "dir", cp.dir, "startup", cp.startupDur.Round(time.Millisecond))
			return cp, nil
		}
		if !errors.Is(err, errPortTaken) || i == attempts {
			return nil, err
		}
		log.Warn("control plane start lost a port race; retrying", "attempt", i, "err", err)
	}
}

func start(ctx context.Context, opts Options, log *slog.Logger, binDir string, advertise net.IP) (_ *ControlPlane, err error) {
	dir, err := os.MkdirTemp(opts.TempDir, "istio-cni-controlplane-")
	if err != nil {
		return nil, fmt.Errorf("create control plane dir: %w", err)
	}
	cp := &ControlPlane{dir: dir, launcher: childproc.NewLauncher(), log: log}
	defer func() {
		if err != nil {
			if stopErr := cp.Stop(); stopErr != nil {
				err = fmt.Errorf("%w (and cleaning up: %v)", err, stopErr)
			}
		}
	}()

	_, serviceNet, err := net.ParseCIDR(ServiceClusterIPRange)
	if err != nil {
		return nil, fmt.Errorf("parse service range: %w", err)
	}
	serviceIP := append(net.IP(nil), serviceNet.IP.To4()...)
	serviceIP[3]++ // the "kubernetes" service takes the first address of the range
	keys, err := newPKI(filepath.Join(dir, "pki"), advertise, serviceIP)
	if err != nil {
		return nil, err
	}
	cp.caData = keys.caCert
	cp.keys = keys

	ports, err := FreePorts(3)
	if err != nil {
		return nil, err
	}
	etcdClient := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	cp.etcdURL = etcdClient
	etcdPeer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	apiPort := ports[2]
	bind := "127.0.0.1"
	if opts.BindAddress != nil {
		bind = opts.BindAddress.String()
	}
	cp.host = "https://" + net.JoinHostPort(bind, strconv.Itoa(apiPort))

	// etcd: plain HTTP on loopback is enough for a throwaway store, and no fsync
	// makes it fast on a slow disk; the data dies with the temp dir anyway.
	cp.etcd, err = cp.launcher.Start("etcd", filepath.Join(binDir, "etcd"), []string{
		"--name=default",
		"--data-dir=" + filepath.Join(dir, "etcd"),
		"--listen-client-urls=" + etcdClient,
		"--advertise-client-urls=" + etcdClient,
		"--listen-peer-urls=" + etcdPeer,
		"--initial-advertise-peer-urls=" + etcdPeer,
		"--initial-cluster=default=" + etcdPeer,
		"--unsafe-no-fsync",
		// A single member has nobody to lose contact with; short timers let it
		// elect itself in about 0.1s instead of more than a second.
		"--heartbeat-interval=10",
		"--election-timeout=100",
		"--log-level=warn",
	}, nil, filepath.Join(dir, "etcd.log"))
	if err != nil {
		return nil, err
	}
	if err := waitReady(ctx, cp.etcd, http.DefaultClient, etcdClient+"/health"); err != nil {
		return nil, err
	}

	apiArgs := []string{
		"--etcd-servers=" + etcdClient,
		"--bind-address=" + bind,
		"--secure-port=" + strconv.Itoa(apiPort),
		"--advertise-address=" + advertise.String(),
		"--cert-dir=" + filepath.Join(dir, "apiserver-certs"),
		"--tls-cert-file=" + keys.servingCertFile,
		"--tls-private-key-file=" + keys.servingKeyFile,
		"--client-ca-file=" + keys.caCertFile,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + keys.saPublicKeyFile,
		"--service-account-signing-key-file=" + keys.saSigningKeyFile,
		"--authorization-mode=Node,RBAC",
		"--service-cluster-ip-range=" + ServiceClusterIPRange,
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--allow-privileged=true",
	}
	apiArgs = append(apiArgs, opts.ExtraAPIServerArgs...)
	cp.apiBin, cp.apiArgs = filepath.Join(binDir, "kube-apiserver"), apiArgs
	cp.apiserver, err = cp.launcher.Start("kube-apiserver", cp.apiBin, apiArgs, nil, filepath.Join(dir, "kube-apiserver.log"))
	if err != nil {
		return nil, err
	}

	if cp.adminCfg, err = cp.adminRESTConfig(keys); err != nil {
		return nil, err
	}
	httpClient, err := rest.HTTPClientFor(cp.adminCfg)
	if err != nil {
		return nil, fmt.Errorf("admin http client: %w", err)
	}
	if err := waitReady(ctx, cp.apiserver, httpClient, cp.host+"/readyz"); err != nil {
		return nil, err
	}
	if cp.admin, err = kubernetes.NewForConfig(cp.adminCfg); err != nil {
		return nil, fmt.Errorf("admin client: %w", err)
	}
	if cp.adminKC, err = writeKubeconfig(filepath.Join(dir, "admin.kubeconfig"), cp.host, cp.caData, "admin", authInfo{certPEM: keys.adminCert, keyPEM: keys.adminKey}); err != nil {
		return nil, err
	}
	// Pods in "default" need its default ServiceAccount, which only the
	// controller-manager would create.
	if err := cp.EnsureNamespace(ctx, "default"); err != nil {
		return nil, err
	}
	return cp, nil
}

func (c *ControlPlane) adminRESTConfig(keys *pki) (*rest.Config, error) {
	cfg := &rest.Config{
		Host: c.host,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   keys.caCert,
			CertData: keys.adminCert,
			KeyData:  keys.adminKey,
		},
		// Tests create objects in bursts; the default client-side limit (5 qps)
		// would only slow them down against a private apiserver.
		QPS:   100,
		Burst: 200,
	}
	if _, err := tls.X509KeyPair(keys.adminCert, keys.adminKey); err != nil {
		return nil, fmt.Errorf("admin key pair: %w", err)
	}
	if !x509.NewCertPool().AppendCertsFromPEM(keys.caCert) {
		return nil, errors.New("ca certificate: no PEM certificate")
	}
	return cfg, nil
}

// waitReady polls url until it answers 200, the process exits, or ctx ends.
func waitReady(ctx context.Context, p *childproc.Process, client *http.Client, url string) error {
	var last string
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		last = probe(ctx, client, url)
		if last == "" {
			return nil
		}
		select {
		case <-p.Exited():
			err := p.ExitError()
			if strings.Contains(err.Error(), "address already in use") {
				return fmt.Errorf("%w: %w", errPortTaken, err)
			}
			return err
		case <-ctx.Done():
			return fmt.Errorf("%s not ready at %s: %w (last answer: %s); last lines of %s:\n%s",
				p.Name, url, ctx.Err(), last, p.LogPath, p.Tail(30))
		case <-tick.C:
		}
	}
}

// probe returns "" when url answers 200 OK, else what went wrong.
func probe(ctx context.Context, client *http.Client, url string) string {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err.Error()
	}
	resp, err := client.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode == http.StatusOK {
		return ""
	}
	return fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
}

// Stop kills the apiserver, then etcd (the apiserver must not outlive its store
// and log errors into a removed directory), and removes the temporary directory.
// It is safe to call more than once.
func (c *ControlPlane) Stop() error {
	c.stopOnce.Do(func() {
		began := time.Now()
		var errs []error
		c.apiMu.Lock()
		defer c.apiMu.Unlock()
		if c.apiserver != nil {
			// A paused apiserver (PauseAPIServer) would not act on SIGTERM.
			_ = syscall.Kill(c.apiserver.Pid(), syscall.SIGCONT)
		}
		for _, p := range []*childproc.Process{c.apiserver, c.etcd} {
			if p == nil {
				continue
			}
			if err := p.Stop(10 * time.Second); err != nil {
				errs = append(errs, err)
			}
		}
		c.launcher.Close()
		if err := os.RemoveAll(c.dir); err != nil {
			errs = append(errs, fmt.Errorf("remove control plane dir: %w", err))
		}
		c.stopErr = errors.Join(errs...)
		c.log.Info("control plane stopped", "dir", c.dir, "took", time.Since(began).Round(time.Millisecond))
	})
	return c.stopErr
}

// FreePorts returns n distinct ports that were free on every address a moment ago.
// All listeners are held until every port is chosen so the kernel cannot hand out
// the same one twice. The node harness uses it too.
func FreePorts(n int) ([]int, error) {
	var ports []int
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", ":0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// NonLoopbackIPv4 is the first IPv4 address of an up, non-loopback interface: the
// address this host's components advertise (the apiserver, a node's kubelet).
func NonLoopbackIPv4() (netip.Addr, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("list interfaces: %w", err)
	}
	for _, iface := range ifaces {
		if iface.Flags&net.FlagUp == 0 || iface.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := iface.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			if ip4 := ipn.IP.To4(); ip4 != nil && ip4.IsGlobalUnicast() {
				return netip.AddrFrom4([4]byte(ip4)), nil
			}
		}
	}
	return netip.Addr{}, errors.New("no up, non-loopback interface with an IPv4 address")
}

// PIDs are the process ids of etcd and kube-apiserver, by name, for measuring their
// CPU and memory from /proc.
func (c *ControlPlane) PIDs() map[string]int {
	return map[string]int{c.etcd.Name: c.etcd.Pid(), c.apiserver.Name: c.apiserver.Pid()}
}
