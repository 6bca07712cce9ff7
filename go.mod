module github.com/istio-cni/istio-cni

go 1.26.8

require (
	github.com/google/go-cmp v0.7.0
	github.com/vishvananda/netlink v1.3.1
	golang.org/x/sys v0.49.0
)

require (
	github.com/containernetworking/cni v1.3.0 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	k8s.io/api v0.33.13 // indirect
	k8s.io/apimachinery v0.33.13 // indirect
	k8s.io/client-go v0.33.13 // indirect
	sigs.k8s.io/yaml v1.6.0 // indirect
)

require (
	github.com/google/nftables v0.3.0 // indirect
	github.com/mdlayher/netlink v1.7.3-0.20250113171957-fbb4dce95f42 // indirect
	github.com/mdlayher/socket v0.5.0 // indirect
	github.com/spf13/pflag v1.0.10
	github.com/vishvananda/netns v0.0.5 // indirect
	golang.org/x/net v0.38.0 // indirect
	golang.org/x/sync v0.6.0 // indirect
)
