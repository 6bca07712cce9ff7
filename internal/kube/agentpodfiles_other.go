//go:build !linux

package kube

import (
	"errors"
	"os"
)

// agentPodFilesKept: the pod files' lock is Linux's (F_OFD_GETLK); elsewhere no
// agent keeps them, and the plugin asks the socket or the API server.
func agentPodFilesKept(string) (bool, error) { return false, nil }

// KeepAgentPodFiles: see the Linux build; elsewhere the files are never kept.
func KeepAgentPodFiles(*os.File) (func(), error) {
	return nil, errors.New("lock the pod files: only on Linux")
}
