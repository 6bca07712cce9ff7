// Package netns runs code inside a network namespace from a multithreaded Go
// process. It owns the unsafe things about namespaces in Go: an OS thread whose
// namespace changed must never run other goroutines, a thread whose namespace
// could not be restored must never be reused, and a user namespace can only be
// joined by a single-threaded process, so a command that must run in a pod's
// user namespace is forked here and joins it between its fork and its exec
// (RunInUserNamespace).
package netns
