// Package netns runs code inside a network namespace from a multithreaded Go
// process. It owns the one unsafe thing about namespaces in Go: an OS thread whose
// namespace changed must never run other goroutines, and a thread whose namespace
// could not be restored must never be reused.
package netns
