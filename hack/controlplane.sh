#!/usr/bin/env bash
# A throwaway etcd + kube-apiserver for poking at by hand, started by the same code
# the tests use (test/harness/controlplane). No controllers, scheduler or kubelet:
# create namespaces' "default" ServiceAccount yourself and set spec.nodeName on pods.
#   hack/controlplane.sh up     start in the background; prints `export KUBECONFIG=...`
#   hack/controlplane.sh down   stop it; removes everything it made
#   hack/controlplane.sh run    run in the foreground until Ctrl-C
# The first run may build the binaries (hack/kube-binaries.sh), which takes minutes.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
state=${ISTIO_CNI_CONTROLPLANE_STATE:-${TMPDIR:-/tmp}/istio-cni-controlplane}
bin=$state/controlplane
kubeconfig=$state/admin.kubeconfig

build() {
  mkdir -p "$state"
  (cd "$root" && go build -o "$bin" ./test/harness/controlplane/cmd/controlplane)
}
running() { [[ -f $state/pid ]] && kill -0 "$(cat "$state/pid")" 2>/dev/null; }

case ${1:-} in
  up)
    if running; then
      echo "already up (pid $(cat "$state/pid"))" >&2
      echo "export KUBECONFIG=$kubeconfig"
      exit 0
    fi
    build
    rm -f "$kubeconfig"
    # Run from the repository root so the command finds hack/kube-binaries.sh. Not in
    # a subshell: $! must be the command itself, the process that down signals.
    cd "$root"
    nohup "$bin" -kubeconfig "$kubeconfig" </dev/null >"$state/controlplane.log" 2>&1 &
    pid=$!
    echo "$pid" >"$state/pid"
    until [[ -f $kubeconfig ]]; do
      if ! kill -0 "$pid" 2>/dev/null; then
        echo "controlplane failed; last lines of $state/controlplane.log:" >&2
        tail -n 40 "$state/controlplane.log" >&2
        rm -f "$state/pid"
        exit 1
      fi
      sleep 0.2
    done
    echo "export KUBECONFIG=$kubeconfig"
    ;;
  down)
    if running; then
      pid=$(cat "$state/pid")
      kill -TERM "$pid"
      while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    fi
    rm -rf "$state"
    ;;
  run)
    build
    cd "$root" && exec "$bin"
    ;;
  *)
    echo "usage: $0 up|down|run" >&2
    exit 2
    ;;
esac
