#!/usr/bin/env bash
# Installs the Debian packages the tests and the demo need on a fresh machine:
# the netfilter and network tools, and what runc is built with (cgo, libseccomp).
# containerd and runc themselves are built from the Go module proxy
# (hack/runtime-binaries.sh), not taken from Debian. Idempotent: it does nothing when
# everything is already there.
set -euo pipefail
need=()
for pair in iptables:iptables nft:nftables ip:iproute2 conntrack:conntrack pkg-config:pkg-config gcc:gcc; do
  cmd=${pair%%:*} pkg=${pair##*:}
  command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
[[ -f /usr/include/seccomp.h && -n $(ls /usr/lib/*/libseccomp.a 2>/dev/null) ]] || need+=(libseccomp-dev)
if ((${#need[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-deps: missing ${need[*]}; run as root (or install them) first" >&2
    exit 1
  fi
  echo "install-deps: installing ${need[*]} (apt-get)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq </dev/null
  apt-get install -y -qq --no-install-recommends "${need[@]}" </dev/null >/dev/null
fi
# Both iptables flavours are exercised by the tests.
for b in iptables-legacy-restore iptables-nft-restore ip6tables-legacy-restore ip6tables-nft-restore; do
  command -v "$b" >/dev/null || { echo "install-deps: $b missing after install" >&2; exit 1; }
done
