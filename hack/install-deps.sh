#!/usr/bin/env bash
# Installs the system packages the tests and the demo need on a fresh Debian machine.
# Idempotent: it does nothing when everything is already there.
set -euo pipefail
need=()
for pair in iptables:iptables nft:nftables ip:iproute2 conntrack:conntrack containerd:containerd runc:runc; do
  cmd=${pair%%:*} pkg=${pair##*:}
  command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-deps: missing ${need[*]}; run as root (or install them) first" >&2
    exit 1
  fi
  echo "install-deps: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# Both iptables flavours are exercised by the tests.
for b in iptables-legacy-restore iptables-nft-restore ip6tables-legacy-restore ip6tables-nft-restore; do
  command -v "$b" >/dev/null || { echo "install-deps: $b missing after install" >&2; exit 1; }
done
