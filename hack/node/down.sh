#!/usr/bin/env bash
# Takes down the node of hack/node/up.sh: pods are deleted through kubelet (CNI DEL),
# then every component stops, and the host is left as up.sh found it. If the node's
# process died, removes what it left instead.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/hack/node/common.sh"

[[ $EUID -eq 0 ]] || { echo "hack/node/down.sh: needs root" >&2; exit 1; }
if running; then
  pid=$(cat "$run/pid")
  log_lines=$(wc -l <"$run/node.log")
  kill -TERM "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  tail -n +"$((log_lines + 1))" "$run/node.log" >&2
elif [[ -d $state ]]; then
  [[ -x $bin ]] || (cd "$root" && mkdir -p "$run" && go build -o "$bin" ./test/harness/node/cmd/node)
  "$bin" -cleanup -state "$state" -pod-cidr "$pod_cidr"
fi
rm -rf "$run"
