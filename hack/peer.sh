#!/usr/bin/env bash
# Prints the path of the Istio CNI plugin that make bench and make bench-add run
# beside this one (test/e2e BenchmarkPluginAdd reads it from ISTIO_CNI_PLUGIN):
#   ISTIO_CNI_PLUGIN=<path>  that binary;
#   ISTIO_CNI_PLUGIN=none    none: this plugin alone, no ratios (an empty line);
#   unset or empty           Istio's plugin at the commit hack/tools/istio-cni-peer
#                            pins, built on first use (a few minutes; cached outside
#                            the repository, keyed by that commit).
set -euo pipefail
cd "$(dirname "$0")/.."
case ${ISTIO_CNI_PLUGIN:-} in
  none) echo ;;
  "") dir=$(hack/tools/install.sh istio-cni-peer); echo "$dir/istio-cni-peer" ;;
  *) echo "$ISTIO_CNI_PLUGIN" ;;
esac
