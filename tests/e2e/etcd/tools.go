//go:build tools

// Package etcd only pins etcd's server main package for build.sh.
package etcd

import _ "go.etcd.io/etcd/server/v3"
