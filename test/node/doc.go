// Package node holds the end-to-end tests of the local single-node cluster
// (test/harness/node): up, a pod on the ptp network reached from the host, down, and a
// host left as it was. They need root and fail without it.
package node
