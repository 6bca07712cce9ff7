//go:build tools

// Package syft pins the syft SBOM tool the image tests (hack/image) run to prove
// that a scanner reads the image's Debian package list. It is its own module so
// that the project's module does not inherit syft's dependencies.
package syft

import _ "github.com/anchore/syft/cmd/syft"
