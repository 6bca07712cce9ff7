package nftables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"

	"github.com/istio-cni/istio-cni/internal/redirect"
)

// Backend programs plans as native nftables tables of our own. It works in the
// network namespace of the calling thread (see netns.Do): both the nft child
// process and the netlink socket are created from that thread.
type Backend struct {
	nft    string
	groups GroupLookup
	// applyVia says how the transaction is written. Reading back always uses nft.
	applyVia applyMethod
}

type applyMethod uint8

const (
	// applyExec writes with nft -f only.
	applyExec applyMethod = iota
	// applyNetlink writes through netlink and falls back to nft -f when that fails:
	// the default, see bench_linux_test.go for why.
	applyNetlink
)

// NewBackend returns the nftables backend. It writes through netlink
// (github.com/google/nftables), falling back to nft -f if the kernel refuses the
// batch; a pod's first apply (none of our tables yet) runs no process at all. Rules
// are read back with the nft binary found in PATH, so Verify compares nft's
// canonical text.
func NewBackend() *Backend {
	return &Backend{nft: "nft", groups: systemGroups, applyVia: applyNetlink}
}

// NewNetlinkBackend is NewBackend (kept for callers that name the write path).
func NewNetlinkBackend() *Backend { return NewBackend() }

// NewExecBackend returns the nftables backend that writes only with nft -f.
func NewExecBackend() *Backend {
	return &Backend{nft: "nft", groups: systemGroups, applyVia: applyExec}
}

// Name implements capture.Backend.
func (b *Backend) Name() string { return "nftables" }

// Apply makes our tables hold exactly the plan, in one nft transaction that deletes
// and recreates every table of ours (including tables a previous plan needed and
// this one does not). When the live tables already equal the plan nothing is
// written and changed is false.
func (b *Backend) Apply(ctx context.Context, plan *redirect.Plan) (bool, error) {
	rs, err := translate(plan, b.groups)
	if err != nil {
		return false, fmt.Errorf("apply nftables: %w", err)
	}
	if b.applyVia == applyNetlink {
		// A pod's first apply finds none of our tables. Asking the kernel that over
		// netlink is cheap, and then the whole apply needs no nft process at all.
		if applied, err := applyIfFresh(rs); err == nil && applied {
			return true, nil
		}
		// Not fresh, lost a race with another writer, or the kernel refused: take
		// the general path below, which lists and reports precisely.
	}
	want, err := parseListing(rs.text())
	if err != nil {
		return false, fmt.Errorf("apply nftables: internal error: rendered rules do not parse: %w", err)
	}
	got, err := b.listOurs(ctx)
	if err != nil {
		return false, fmt.Errorf("apply nftables: %w", err)
	}
	if len(diffTables(want, got)) == 0 {
		return false, nil
	}
	err = b.transact(ctx, rs, got)
	if err != nil {
		// A table of ours may have appeared since the listing (a concurrent apply),
		// which fails "create table" and with it the whole transaction, changing
		// nothing. Look again and retry once.
		got, lerr := b.listOurs(ctx)
		if lerr != nil {
			return false, fmt.Errorf("apply nftables: %w", errors.Join(err, lerr))
		}
		if err2 := b.transact(ctx, rs, got); err2 != nil {
			return false, fmt.Errorf("apply nftables: %w", err2)
		}
	}
	return true, nil
}

// transact runs the one transaction that replaces our present tables with rs.
func (b *Backend) transact(ctx context.Context, rs *ruleset, got []listedTable) error {
	var present []tableID
	for _, t := range got {
		present = append(present, t.id)
	}
	if b.applyVia == applyNetlink {
		nlErr := applyNetlinkRuleset(rs, present)
		if nlErr == nil {
			return nil
		}
		// The failed batch changed nothing (it is one transaction), so nft can try
		// the same change; if it fails too, its message says which rule is wrong.
		if _, err := b.run(ctx, transactionScript(rs, present), "-f", "-"); err != nil {
			return errors.Join(nlErr, err)
		}
		return nil
	}
	_, err := b.run(ctx, transactionScript(rs, present), "-f", "-")
	return err
}

// Verify lists every difference between our live tables and the plan.
func (b *Backend) Verify(ctx context.Context, plan *redirect.Plan) ([]string, error) {
	text, err := renderWith(plan, b.groups)
	if err != nil {
		return nil, fmt.Errorf("verify nftables: %w", err)
	}
	want, err := parseListing(text)
	if err != nil {
		return nil, fmt.Errorf("verify nftables: internal error: rendered rules do not parse: %w", err)
	}
	got, err := b.listOurs(ctx)
	if err != nil {
		return nil, fmt.Errorf("verify nftables: %w", err)
	}
	return diffTables(want, got), nil
}

// Cleanup deletes our tables, and only them, in one transaction. The ruleset is
// never flushed: other tables in the namespace (iptables-nft's included) survive.
func (b *Backend) Cleanup(ctx context.Context) error {
	got, err := b.listOurs(ctx)
	if err != nil {
		return fmt.Errorf("clean up nftables: %w", err)
	}
	if len(got) == 0 {
		return nil
	}
	var ids []tableID
	for _, t := range got {
		ids = append(ids, t.id)
	}
	if _, err := b.run(ctx, deleteScript(ids), "-f", "-"); err != nil {
		return fmt.Errorf("clean up nftables: %w", err)
	}
	return nil
}

func renderWith(plan *redirect.Plan, groups GroupLookup) (string, error) {
	rs, err := translate(plan, groups)
	if err != nil {
		return "", err
	}
	return rs.text(), nil
}

// listOurs reads our tables with a single nft call.
func (b *Backend) listOurs(ctx context.Context) ([]listedTable, error) {
	out, err := b.run(ctx, "", "list", "ruleset")
	if err != nil {
		return nil, err
	}
	ts, err := parseListing(out)
	if err != nil {
		return nil, fmt.Errorf("parse nft list ruleset: %w", err)
	}
	return ts, nil
}

// run runs nft with args, feeding stdin, and returns its stdout. Errors carry
// nft's stderr, which names the failing line of a script.
func (b *Backend) run(ctx context.Context, stdin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, b.nft, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			return "", fmt.Errorf("nft %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return "", fmt.Errorf("run nft %s: %w", strings.Join(args, " "), err)
	}
	return stdout.String(), nil
}
