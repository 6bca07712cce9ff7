// Package image builds the project's container images without a Docker engine:
// static Go binaries built reproducibly (GoBuild), laid out in a single-layer OCI
// image (Build), written as an OCI archive (WriteArchive) that containerd imports
// (Import). The same inputs give the same bytes and so the same digest: files are
// sorted, owned by root, dated at the epoch, and the config carries no build time.
//
// The agent image (AgentSpec) holds the four static binaries and, for repair in
// place and the doctor, which run the plugin's backends inside the container,
// iptables (both flavours) and nft with the libraries they load, copied from the
// build machine (HostTools). Its digest then depends on that machine's iptables and
// nftables packages, and is the same for every build there.
package image
