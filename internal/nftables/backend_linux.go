package nftables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/istio-cni/istio-cni/internal/applylock"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/internal/timing"
)

// Backend programs plans as native nftables tables of our own. It works in the
// network namespace of the calling thread (see netns.Do): its netlink sockets, and
// the nft child process when it runs one, are created from that thread.
type Backend struct {
	nft    string
	groups GroupLookup
	// applyVia says how changes are written. Reading is always over netlink.
	applyVia applyMethod
	// istioTables: Cleanup also deletes the tables of Istio's own native
	// nftables mode (IstioNativeTables).
	istioTables bool
}

type applyMethod uint8

const (
	// applyExec writes with nft -f only.
	applyExec applyMethod = iota
	// applyNetlink writes through netlink, falling back to nft -f (where it is
	// installed) when the kernel refuses the batch: the default, see
	// bench_linux_test.go for why.
	applyNetlink
)

// NewBackend returns the nftables backend. It reads and writes through netlink
// (github.com/google/nftables) and needs no nft binary; where nft is installed it
// is run only if the kernel refuses a netlink batch, for its precise message.
func NewBackend() *Backend {
	return &Backend{nft: "nft", groups: systemGroups, applyVia: applyNetlink}
}

// NewNetlinkBackend is NewBackend (kept for callers that name the write path).
func NewNetlinkBackend() *Backend { return NewBackend() }

// NewExecBackend returns the nftables backend that writes only with nft -f (and
// still reads over netlink).
func NewExecBackend() *Backend {
	return &Backend{nft: "nft", groups: systemGroups, applyVia: applyExec}
}

// Name implements capture.Backend.
func (b *Backend) Name() string { return "nftables" }

// Apply makes our tables hold exactly the plan, in one transaction that deletes
// and recreates every table of ours (including tables a previous plan needed and
// this one does not). When the live tables already equal the plan nothing is
// written and changed is false. The namespace's apply lock is let go on
// return.
func (b *Backend) Apply(ctx context.Context, plan *redirect.Plan) (bool, error) {
	changed, _, release, err := b.ApplyWithRollback(ctx, plan)
	release()
	return changed, err
}

// ApplyWithRollback is Apply. The transaction is all or nothing: an apply that
// fails has changed nothing. rollback puts back, after an apply that changed the
// tables, our tables as the apply read them before it wrote, in one transaction
// of the same kind: capture.Apply runs it when the routing fails after the rules
// went in. What was there is an earlier apply's capture of the same pod (the
// runtime's ADD, which the agent's repair in place or a retried ADD applies
// over), which reported itself done: removing our tables, as the rollback did
// before, left that pod with no capture at all. A namespace that held none of
// our tables is left with none. Tables that hold what this backend does not
// write (a rule it cannot read, a named set, a dormant table, a hook of another
// kind: someone changed them since) cannot be written back: rollback says so
// and leaves the apply's tables, a whole capture.
//
// The apply holds the namespace's apply lock (applylock.Take) from before its
// read, and release lets it go: capture.Apply does, once its routing and its
// rollback are done. Another apply into the namespace (a retried ADD beside the
// first, the agent's repair in place) then neither writes between this one's
// write and its rollback, which would put back the tables found before and so
// undo what it reported done, nor finds this one's routing in place and relies
// on it while this one, failing, is about to remove it. Before, it took none.
func (b *Backend) ApplyWithRollback(ctx context.Context, plan *redirect.Plan) (changed bool, rollback func(context.Context) error, release func(), err error) {
	rollback, release = func(context.Context) error { return nil }, func() {}
	rs, err := translate(plan, b.groups)
	if err != nil {
		return false, rollback, release, fmt.Errorf("apply nftables: %w", err)
	}
	timing.Mark(ctx, "nft-translate")
	if release, err = applylock.Take(ctx); err != nil {
		return false, rollback, func() {}, fmt.Errorf("apply nftables: %w", err)
	}
	timing.Mark(ctx, "nft-apply-lock")
	changed, found, err := b.applyOnce(ctx, rs)
	if err != nil {
		// A table of ours may have appeared since the read (an apply of a
		// build before the lock, during an upgrade), which fails "create
		// table" and with it the whole transaction, changing nothing. Read
		// again, on a new socket, and retry once.
		changed, found, err = b.applyOnce(ctx, rs)
	}
	if err != nil {
		return false, rollback, release, fmt.Errorf("apply nftables: %w", err)
	}
	if changed {
		rollback = func(ctx context.Context) error {
			was, err := rulesetOf(found)
			if err != nil {
				return fmt.Errorf("put back the nftables tables found before the apply: %w; the apply's tables are left in place", err)
			}
			if _, _, err := b.applyOnce(ctx, was); err != nil {
				return fmt.Errorf("put back the nftables tables found before the apply: %w", err)
			}
			return nil
		}
	}
	return changed, rollback, release, nil
}

// applyOnce reads our tables (found) and, unless they already hold rs, replaces
// them.
func (b *Backend) applyOnce(ctx context.Context, rs *ruleset) (changed bool, found []liveTable, err error) {
	c, err := dialHere()
	if err != nil {
		return false, nil, err
	}
	// After a failed batch the socket may still hold replies: never reuse it.
	// Closing a socket that committed a batch can wait: the kernel's release of a
	// NETLINK_NETFILTER socket first flushes the namespace's pending destroy work
	// of that commit, which waits for an RCU grace period. Its own phase says so.
	defer func() {
		c.Close()
		timing.Mark(ctx, "nft-close")
	}()
	got, err := readOurs(c.Conn)
	timing.Mark(ctx, "nft-read")
	if err != nil {
		return false, nil, fmt.Errorf("read our tables: %w", err)
	}
	if len(diffTables(rs, got)) == 0 {
		return false, got, nil
	}
	defer timing.Mark(ctx, "nft-write")
	var present []tableID
	for _, t := range got {
		present = append(present, t.id)
	}
	if b.applyVia == applyExec {
		_, err := b.run(ctx, transactionScript(rs, present), "-f", "-")
		return err == nil, got, err
	}
	nlErr := flushRuleset(c, rs, present)
	if nlErr == nil {
		return true, got, nil
	}
	if _, err := exec.LookPath(b.nft); err != nil {
		return false, got, nlErr
	}
	// The failed batch changed nothing (it is one transaction), so nft can try the
	// same change; if it fails too, its message says which rule is wrong.
	if _, err := b.run(ctx, transactionScript(rs, present), "-f", "-"); err != nil {
		return false, got, errors.Join(nlErr, err)
	}
	return true, got, nil
}

// Verify lists every difference between our live tables and the plan, reading
// the tables over netlink and comparing rules by their expressions.
func (b *Backend) Verify(ctx context.Context, plan *redirect.Plan) ([]string, error) {
	rs, err := translate(plan, b.groups)
	if err != nil {
		return nil, fmt.Errorf("verify nftables: %w", err)
	}
	c, err := dialHere()
	if err != nil {
		return nil, fmt.Errorf("verify nftables: %w", err)
	}
	defer c.Close()
	got, err := readOurs(c.Conn)
	if err != nil {
		return nil, fmt.Errorf("verify nftables: read our tables: %w", err)
	}
	return diffTables(rs, got), nil
}

// Chains reads our chains back over netlink, for capture.Check.
func (b *Backend) Chains(ctx context.Context) ([]redirect.LiveChain, error) {
	c, err := dialHere()
	if err != nil {
		return nil, fmt.Errorf("read nftables chains: %w", err)
	}
	defer c.Close()
	got, err := readOurs(c.Conn)
	if err != nil {
		return nil, fmt.Errorf("read nftables chains: read our tables: %w", err)
	}
	var chains []redirect.LiveChain
	for _, t := range got {
		for _, lc := range t.chains {
			ch := redirect.LiveChain{Table: "table " + t.id.String(), Name: lc.name, Hook: lc.base != nil, Rules: len(lc.rules)}
			for _, r := range lc.rules {
				if r.jump != "" && t.chain(r.jump) != nil {
					ch.Jumps = append(ch.Jumps, r.jump)
				}
			}
			chains = append(chains, ch)
		}
	}
	return chains, nil
}

// Cleanup deletes our tables, and only them, in one transaction (with
// WithIstioTables, Istio's too). The ruleset is never flushed: other tables in the
// namespace (iptables-nft's included) survive.
func (b *Backend) Cleanup(ctx context.Context) error {
	c, err := dialHere()
	if err != nil {
		return fmt.Errorf("clean up nftables: %w", err)
	}
	defer c.Close()
	all, err := c.Conn.ListTables()
	if err != nil {
		return fmt.Errorf("clean up nftables: list tables: %w", err)
	}
	var ids []tableID
	for _, t := range all {
		id, ok := anyTableID(t)
		if ok && (isOurs(id) || b.istioTables && slices.Contains(IstioNativeTables, id.String())) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	if b.applyVia == applyExec {
		_, err = b.run(ctx, deleteScript(ids), "-f", "-")
	} else {
		err = deleteTables(c, ids)
	}
	if err != nil {
		return fmt.Errorf("clean up nftables: %w", err)
	}
	return nil
}

// WithIstioTables makes Cleanup also delete the tables Istio's own istio-iptables
// writes in its native nftables mode (IstioNativeTables), as its --cleanup-only
// does: this project's istio-iptables then cleans up after either.
func (b *Backend) WithIstioTables() *Backend {
	b.istioTables = true
	return b
}

// IstioNativeTables are the tables of Istio's native nftables mode (Istio's
// tools/istio-nftables, inet family), as `nft list tables` names them. Ours have
// the same names in the ip and ip6 families.
var IstioNativeTables = []string{"inet istio-proxy-nat", "inet istio-proxy-mangle", "inet istio-proxy-raw"}

// List reads our tables in the calling thread's network namespace over netlink and
// prints them in the syntax of `nft list table`. A rule this backend would not
// write is printed as far as it decodes, then expression by expression.
func List() (string, error) {
	c, err := dialHere()
	if err != nil {
		return "", fmt.Errorf("list nftables: %w", err)
	}
	defer c.Close()
	got, err := readOurs(c.Conn)
	if err != nil {
		return "", fmt.Errorf("list nftables: %w", err)
	}
	return liveText(got), nil
}

// RunWaitDelay bounds how long run still waits for nft's output once nft has
// exited or was killed at the context's end: a wrapper script's child can hold
// the output pipes open long after; without the bound the ADD would wait for it
// past the runtime's own timeout.
const RunWaitDelay = 2 * time.Second

// run runs nft with args, feeding stdin, and returns its stdout. Errors carry
// nft's stderr, which names the failing line of a script.
func (b *Backend) run(ctx context.Context, stdin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, b.nft, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = RunWaitDelay
	if err := cmd.Run(); err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			err = fmt.Errorf("%w, stopped when its bound ran out: %w", err, ctxErr)
		}
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			return "", fmt.Errorf("nft %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return "", fmt.Errorf("run nft %s: %w", strings.Join(args, " "), err)
	}
	return stdout.String(), nil
}
