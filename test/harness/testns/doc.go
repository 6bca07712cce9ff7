// Package testns makes throwaway network namespaces for tests and the demo, mounted
// where a test can name them and removed afterwards. It is test harness: the product
// enters namespaces the runtime made (internal/netns) and never makes its own.
package testns
