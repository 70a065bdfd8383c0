//go:build tools

// Package e2e only pins the main packages build.sh compiles, so that `go mod tidy`
// keeps their dependencies in go.sum.
package e2e

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
