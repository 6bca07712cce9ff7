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
	// applyVia programs the transaction; nft -f by default (see bench_linux_test.go
	// for why).
	applyVia applyMethod
}

type applyMethod uint8

const (
	applyExec applyMethod = iota
	applyNetlink
)

// NewBackend returns the nftables backend, which runs the nft binary found in PATH.
func NewBackend() *Backend {
	return &Backend{nft: "nft", groups: systemGroups}
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
	var present []tableID
	for _, t := range got {
		present = append(present, t.id)
	}
	if b.applyVia == applyNetlink {
		err = applyNetlinkRuleset(rs, present)
	} else {
		_, err = b.run(ctx, transactionScript(rs, present), "-f", "-")
	}
	if err != nil {
		return false, fmt.Errorf("apply nftables: %w", err)
	}
	return true, nil
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
