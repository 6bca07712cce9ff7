// Command kubectl is upstream kubectl built from the published k8s.io/kubectl module
// (what k8s.io/kubernetes/cmd/kubectl does, without the k8s.io/kubernetes module):
// hack/node/up.sh builds it into the cache for people poking at the local node.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err)
	}
}
