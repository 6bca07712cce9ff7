module github.com/istio-cni/istio-cni

go 1.26.8

require (
	github.com/google/go-cmp v0.7.0
	github.com/vishvananda/netlink v1.3.1
	golang.org/x/sys v0.49.0
)

require github.com/vishvananda/netns v0.0.5 // indirect
