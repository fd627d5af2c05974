// Command kubectl is the upstream kubectl (k8s.io/kubectl, the same release as the member
// clusters' kube-apiserver), built from the Go module proxy into ./bin by `make kubectl` for
// `make demo`: a fresh machine has only Go, and the demo shows `kubectl auth can-i` on the
// member clusters as a newcomer would type it. This is kubectl's own main
// (k8s.io/kubernetes/cmd/kubectl), minus the plugin-handling details of its error printing.
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
