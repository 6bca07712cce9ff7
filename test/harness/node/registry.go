package node

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// TrustRegistry makes the node's containerd pull images from the registry at host
// (host:port) over HTTPS, trusting the CA caPEM, the way a cluster's nodes are set up
// for a private registry: a hosts.toml in containerd's registry config directory
// (config_path, under the state dir). containerd reads that directory at each pull,
// so this works on a running node. Credentials come from the pods' imagePullSecrets,
// which the kubelet hands to containerd.
func (n *Node) TrustRegistry(host string, caPEM []byte) error {
	if host == "" || strings.ContainsAny(host, "/\\ ") || host == "." || host == ".." {
		return fmt.Errorf("node: registry host %q: want host or host:port", host)
	}
	dir := filepath.Join(n.l.registryHostsDir(), host)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	ca := filepath.Join(dir, "ca.pem")
	if err := writeAtomic(ca, caPEM, 0o644); err != nil {
		return err
	}
	server := strconv.Quote("https://" + host)
	hosts := "server = " + server + "\n\n[host." + server + "]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = " + strconv.Quote(ca) + "\n"
	return writeAtomic(filepath.Join(dir, "hosts.toml"), []byte(hosts), 0o644)
}
