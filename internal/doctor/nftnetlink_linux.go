package doctor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"

	gnft "github.com/google/nftables"

	"github.com/istio-cni/istio-cni/internal/nftables"
	"github.com/istio-cni/istio-cni/internal/redirect"
)

// The plugin's nftables backend reads our tables over netlink and needs no nft
// binary, so the doctor compares rule by rule whether or not nft is installed.
// Where nft is missing (a minimal node or image) the live tables it shows are read
// through that same backend (nftables.List) instead of printed by nft, and the
// iptables side is looked at through netlink as far as it shows there.

// netlinkNote is added to the output when nft is missing.
const netlinkNote = "nft is not installed here: the live nftables rules shown were read through netlink and printed by istio-cni, not by nft"

// haveNft reports whether nft is in PATH, to print the live tables with it.
func haveNft() bool {
	_, err := exec.LookPath("nft")
	return err == nil
}

// haveIptablesSave reports whether any iptables-save the iptables backend could use
// is in PATH.
func haveIptablesSave() bool {
	return lookPath("iptables-save", "iptables-nft-save", "iptables-legacy-save") != ""
}

// netlinkBackend is the plugin's nftables backend made read-only: the doctor never
// writes rules.
type netlinkBackend struct{}

func (netlinkBackend) Name() string { return "nftables" }

func (netlinkBackend) Apply(context.Context, *redirect.Plan) (bool, error) {
	return false, errors.New("the doctor never writes rules")
}

func (netlinkBackend) Cleanup(context.Context) error {
	return errors.New("the doctor never writes rules")
}

// Verify lists the differences between our live tables and the plan's, in the
// calling thread's network namespace, as the plugin's CHECK does.
func (netlinkBackend) Verify(ctx context.Context, plan *redirect.Plan) ([]string, error) {
	return nftables.NewBackend().Verify(ctx, plan)
}

// iptablesNftChains is a read-only capture.Backend standing in for the iptables
// one where iptables-save is missing: the ISTIO chains iptables-nft keeps in
// nftables tables are seen through netlink; iptables-legacy rules are not.
type iptablesNftChains struct{ netlinkBackend }

func (iptablesNftChains) Name() string { return "iptables-nft" }

// Verify lists our iptables-nft chains; only an empty plan is checked.
func (iptablesNftChains) Verify(_ context.Context, plan *redirect.Plan) ([]string, error) {
	if len(plan.Families) > 0 {
		return nil, errors.New("verify iptables-nft through netlink: only the absence of rules can be checked")
	}
	chains, err := iptablesNftChainNames()
	if err != nil {
		return nil, fmt.Errorf("verify iptables-nft through netlink: %w", err)
	}
	for i, c := range chains {
		chains[i] = c + " (iptables-nft) is not expected"
	}
	return chains, nil
}

// readShapes reads, without nft, our tables (printed in nft's syntax by the
// nftables backend) and the names of chains of ours (ISTIO_*) in other tables:
// iptables-nft keeps its rules in nftables tables, so its ISTIO chains show there
// (iptables-legacy rules do not).
func readShapes() (ourTables string, iptablesNft []string, err error) {
	ourTables, err = nftables.List()
	if err != nil {
		return "", nil, err
	}
	iptablesNft, err = iptablesNftChainNames()
	if err != nil {
		return "", nil, err
	}
	return ourTables, iptablesNft, nil
}

// shapesText is readShapes' text of our tables, for people.
func shapesText(ourTables string) string { return ourTables }

// iptablesNftChainNames lists the ISTIO chains in tables that are not ours.
func iptablesNftChainNames() ([]string, error) {
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, err
	}
	defer self.Close()
	c, err := gnft.New(gnft.WithNetNSFd(int(self.Fd())))
	if err != nil {
		return nil, err
	}
	defer c.CloseLasting()
	chains, err := c.ListChains()
	if err != nil {
		return nil, fmt.Errorf("list chains: %w", err)
	}
	var names []string
	for _, ch := range chains {
		fam := familyName(ch.Table.Family)
		ours := (fam == "ip" || fam == "ip6") && strings.HasPrefix(ch.Table.Name, nftables.TablePrefix)
		if !ours && strings.HasPrefix(ch.Name, "ISTIO") {
			names = append(names, fmt.Sprintf("table %s %s chain %s", fam, ch.Table.Name, ch.Name))
		}
	}
	sort.Strings(names)
	return names, nil
}

func familyName(f gnft.TableFamily) string {
	switch f {
	case gnft.TableFamilyIPv4:
		return "ip"
	case gnft.TableFamilyIPv6:
		return "ip6"
	case gnft.TableFamilyINet:
		return "inet"
	case gnft.TableFamilyARP:
		return "arp"
	case gnft.TableFamilyBridge:
		return "bridge"
	case gnft.TableFamilyNetdev:
		return "netdev"
	}
	return fmt.Sprintf("family-%d", f)
}
