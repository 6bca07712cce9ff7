//go:build tools

// Package etcd pins the etcd server the local control plane uses (see ../kube-binaries.sh).
package etcd

import _ "go.etcd.io/etcd/server/v3"
