// Package kube is the plugin's access to the Kubernetes API, kept small because the
// plugin is exec'd once per pod: a kubeconfig loader, a GET-only client (a pod in
// Kubernetes' protobuf encoding, anything else in JSON), and a minimal Pod type
// holding only what the plugin reads (no k8s.io/api, no client-go).
package kube
