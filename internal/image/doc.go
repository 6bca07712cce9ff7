// Package image builds the project's container images without a Docker engine:
// static Go binaries built reproducibly (GoBuild), laid out in a single-layer OCI
// image (Build), written as an OCI archive (WriteArchive) that containerd imports
// (Import). The same inputs give the same bytes and so the same digest: files are
// sorted, owned by root, dated at the epoch, and the config carries no build time.
//
// The agent image (AgentSpec) holds only the four static binaries. It carries no
// iptables: the plugin, which does the normal work, runs on the node and uses the
// node's iptables. Only the agent's repair-in-place path programs rules from inside
// the container, and there it needs the native nftables backend (netlink, no
// binaries; chart value nativeNftables=true). Copying the build host's dynamically
// linked xtables-*-multi, its libraries and its extension modules into the image
// would tie the image to the build host's distribution and break reproducibility
// across hosts.
package image
