package iptables

import (
	"fmt"
	"strings"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// Mode is the iptables implementation the rules are written with.
type Mode string

const (
	// ModeAuto picks nft when iptables-nft is installed, else legacy. The choice
	// depends only on the installed binaries, never on rules found in a pod, so a
	// pod is always programmed the same way.
	ModeAuto   Mode = ""
	ModeLegacy Mode = "legacy"
	ModeNFT    Mode = "nft"
)

// ParseMode parses an --iptables-mode value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.TrimSpace(s)); m {
	case ModeAuto, ModeLegacy, ModeNFT:
		return m, nil
	case "auto":
		return ModeAuto, nil
	}
	return "", fmt.Errorf("%s is not an iptables mode (legacy, nft or auto)", redirect.Quote(s))
}
