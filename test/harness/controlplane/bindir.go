package controlplane

import "context"

// BinDir is the directory Start takes etcd and kube-apiserver from, found the same
// way. The same build holds the other Kubernetes servers, for a test that needs
// one of them beside the control plane (kube-controller-manager's garbage
// collector, say).
func BinDir(ctx context.Context, opts Options) (string, error) { return locateBinaries(ctx, opts) }
