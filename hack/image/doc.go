// Package image builds the project's container images without a Docker engine:
// static Go binaries built reproducibly for each architecture (GoBuild), laid out
// in single-layer OCI images (Build), gathered in an image index (BuildIndex),
// written as an OCI archive (WriteArchive) that containerd imports (Import). The
// same inputs give the same bytes and so the same digest: files are sorted, owned
// by root, dated at the epoch, and the config carries no build time.
//
// The agent image (BuildAgent) is an index of a linux/amd64 and a linux/arm64
// image. Each holds the four static binaries and, for repair in place and the
// doctor, which run the plugin's backends inside the container, iptables (both
// flavours) and nft. Those operating-system files come from Debian packages pinned
// in debian.lock (written by ./debianlock from the Packages indexes of the Debian
// mirror apt uses, resolved by resolveDebian), unpacked from the .debs
// (readDeb) with dpkg's database kept (installDebs), so that image scanners list
// the packages and their versions. An SPDX SBOM (SBOM) is written beside the
// archive.
package image
