package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/istio-cni/istio-cni/internal/applylock"
	"github.com/istio-cni/istio-cni/internal/netns"
	"github.com/istio-cni/istio-cni/internal/nftables"
	"github.com/istio-cni/istio-cni/internal/redirect"
	"github.com/istio-cni/istio-cni/internal/timing"
)

// Config configures the iptables backend.
type Config struct {
	Mode Mode
	// LockDir holds one xtables lock file per network namespace (legacy mode), so
	// pods set up in parallel do not wait for each other (the apply lock of
	// Backend.ApplyWithRollback is the namespace's own, applylock). When empty,
	// iptables' own XTABLES_LOCKFILE, if set in the environment, is the one lock
	// of every namespace (as iptables itself uses it); otherwise
	// /run/istio-cni/xtables.
	LockDir string
	// NativeStateDir, when set, lets nft mode write a new namespace's rules
	// without iptables-nft-restore (native_linux.go), once the node's
	// iptables-nft is known to read them; the version is remembered there.
	// Empty: every write is a restore.
	NativeStateDir string
}

// Backend writes plans with iptables-restore: one restore per family per apply,
// or in nft mode, for a namespace without tables, the restore's own netlink batch
// sent without the process (see Config.NativeStateDir).
type Backend struct {
	mode     Mode
	lockDir  string
	lockPath string // XTABLES_LOCKFILE, when it replaces the per-namespace locks
	tools    map[redirect.Family]tools
	// nodeLock is the lock legacy iptables before 1.8.6 takes whatever
	// XTABLES_LOCKFILE says: its build's, the node's /run/xtables.lock (see
	// restore). A test points it at a file of its own.
	nodeLock       string
	nodeLockOnce   sync.Once
	nodeLockMasked bool // see masksNodeLock

	nativeDir  string
	nativeOnce sync.Once
	native     bool // see nativeAllowed
	// writeNative and cleanupNative send one family's native batch (writeNative and
	// cleanupNative of native_linux.go); a test of the restore fallback replaces
	// them on its own Backend to have the kernel refuse.
	writeNative   func([]nativeObjects) error
	cleanupNative func(redirect.Family) error
}

type fallbacksKey struct{}

// WithNativeFallbacks returns a context under which Apply adds to *into each
// native write the kernel refused and whose rules the restore then wrote: the pod
// is captured, and the refusal is worth a warning (this iptables-nft writes rules
// the native writer does not), which the caller logs. The record is the apply's
// own: concurrent applies on one Backend (the repair controller's) each get
// theirs.
func WithNativeFallbacks(ctx context.Context, into *[]error) context.Context {
	return context.WithValue(ctx, fallbacksKey{}, into)
}

type tools struct {
	save, restore string
	// flavoured: the names carry the mode (iptables-nft-save), so the tools are
	// known to write the mode's tables (see tablesHeld).
	flavoured bool
}

// NewBackend resolves the mode and the binaries once.
func NewBackend(cfg Config) (*Backend, error) {
	mode, found, _, err := findTools(cfg.Mode, lookupAt(NodeView{Root: "/"}))
	if err != nil {
		return nil, fmt.Errorf("iptables backend (%s mode): %w", mode, err)
	}
	b := &Backend{mode: mode, lockDir: cfg.LockDir, nativeDir: cfg.NativeStateDir, tools: found,
		nodeLock: "/run/xtables.lock", writeNative: writeNative, cleanupNative: cleanupNative}
	if b.lockDir == "" {
		if f := os.Getenv("XTABLES_LOCKFILE"); f != "" {
			b.lockPath, b.lockDir = f, filepath.Dir(f)
		} else {
			b.lockDir = "/run/istio-cni/xtables"
		}
	}
	return b, nil
}

// Name implements capture.Backend.
func (b *Backend) Name() string { return "iptables-" + string(b.mode) }

// Mode is the resolved mode.
func (b *Backend) Mode() Mode { return b.mode }

// MaxOutputBytes bounds what the plugin reads of an iptables-save or restore's
// output: a namespace's rules are a few KiB; a larger output fails the command,
// naming the bound, rather than filling the plugin's memory. Of stderr the first
// maxStderrBytes are kept for the error.
const (
	MaxOutputBytes = 64 << 20
	maxStderrBytes = 64 << 10
)

// RunWaitDelay bounds how long run still waits for a tool's output once the
// tool has exited or was killed at the context's end: a wrapper script's child
// (iptables-restore run by a script without exec) can hold the output pipes
// open long after; without the bound the ADD would wait for it past the
// runtime's own timeout. One bound for every tool the plugin runs: nft's.
const RunWaitDelay = nftables.RunWaitDelay

func (b *Backend) run(ctx context.Context, u userNS, bin string, stdin string, args ...string) (string, error) {
	return b.runMasked(ctx, u, masking{}, bin, stdin, args...)
}

// userNS is the user namespace the tools of one operation run in: ownUserNS, this
// process's, or a descriptor of the one that owns the calling thread's network
// namespace (podUserNamespace).
type userNS int

const ownUserNS userNS = -1

// podUserNamespace is the user namespace the tools must run in to write the calling
// thread's network namespace: ownUserNS, but for a pod with hostUsers: false,
// whose network namespace containerd 2 and CRI-O make inside the pod's own user
// namespace. There the kernel's owner match (xt_owner, under iptables-nft too)
// refuses a uid or gid rule written from any other user namespace ("Invalid
// argument"), and reads the rule's ids as the pod's: the proxy's 1337 is the
// pod's 1337, which is what the plan holds. So for such a pod every tool runs in
// the pod's user namespace (netns.RunInUserNamespace), save as well as restore,
// for the ADD, the CHECK and the DEL alike. It is one open, one ioctl and one
// stat per operation (netns.ForeignOwner); when the owner cannot be told (a
// kernel before 4.9), the tools run as before. The caller closes it.
func podUserNamespace() userNS {
	fd, err := netns.ForeignOwner("/proc/thread-self/ns/net")
	if err != nil || fd < 0 {
		return ownUserNS
	}
	return userNS(fd)
}

func (u userNS) close() {
	if u != ownUserNS {
		unix.Close(int(u))
	}
}

// toolCaps are the capabilities a tool keeps in a pod's user namespace: NET_ADMIN
// to read and write the tables (nftables' netlink, legacy's socket options),
// NET_RAW for the raw socket legacy iptables opens. They count in the pod's
// namespaces only; its uid stays the plugin's (the node's root, not the pod's),
// so it opens the lock files and the masks as a tool in the node's namespace does.
var toolCaps = []uintptr{unix.CAP_NET_ADMIN, unix.CAP_NET_RAW}

// masking says which of the node's files a tool runs without (runWithMasks).
type masking struct {
	// nodeLock: the namespace's lock file in place of the node's (masksNodeLock).
	nodeLock bool
	// nsswitch: /dev/null in place of nsswitch.conf, so that the tool's user
	// and group lookups read /etc/passwd and /etc/group only (nssIsLocal).
	nsswitch bool
}

// runMasked is run, in a mount namespace of its own when m masks anything, and in
// the user namespace u when it is not this process's.
func (b *Backend) runMasked(ctx context.Context, u userNS, m masking, bin string, stdin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	stdout := &boundedBuffer{max: MaxOutputBytes}
	stderr := &boundedBuffer{max: maxStderrBytes, truncate: true}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	lock := b.lockFile()
	cmd.Env = append(os.Environ(), "XTABLES_LOCKFILE="+lock)
	cmd.WaitDelay = RunWaitDelay
	var masks []fileMask
	if m.nodeLock {
		masks = append(masks, fileMask{src: lock, dst: b.nodeLock, create: true})
	}
	if m.nsswitch {
		masks = append(masks, fileMask{src: os.DevNull, dst: nsswitchConf, readOnly: true})
	}
	runCmd := cmd.Run
	if u != ownUserNS {
		runCmd = func() error {
			err := netns.RunInUserNamespace(ctx, int(u), toolCaps, cmd)
			if _, exited := err.(*exec.ExitError); err != nil && !exited && ctx.Err() == nil {
				err = fmt.Errorf("%w (it runs in the user namespace that owns the network namespace, a pod's with hostUsers: false, "+
					"where the kernel takes the proxy's uid and gid rules only from inside: the nftables backend, native_nftables: true, captures such a pod without it)", err)
			}
			return err
		}
	}
	if len(masks) > 0 {
		run := runCmd
		runCmd = func() error { return runWithMasks(run, masks) }
	}
	if err := runCmd(); err != nil {
		if stdout.over {
			err = fmt.Errorf("its output is over %d bytes: %w", MaxOutputBytes, err)
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			err = fmt.Errorf("%w, stopped when its bound ran out: %w", err, ctxErr)
		}
		tool := strings.Join(append([]string{filepath.Base(bin)}, args...), " ")
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return "", fmt.Errorf("%s: %w: %s", tool, err, msg)
		}
		return "", fmt.Errorf("%s: %w", tool, err)
	}
	return stdout.String(), nil
}

// boundedBuffer keeps at most max bytes: past them a write fails (the command's
// copy stops and the command fails), or with truncate the rest is dropped. (It
// holds its buffer rather than embedding it: an embedded bytes.Buffer's ReadFrom
// would let io.Copy write past Write.)
type boundedBuffer struct {
	buf      bytes.Buffer
	max      int
	truncate bool
	over     bool
}

var errOutputTooLarge = errors.New("output over the bound")

func (w *boundedBuffer) Write(p []byte) (int, error) {
	if room := w.max - w.buf.Len(); len(p) > room {
		w.over = true
		w.buf.Write(p[:max(room, 0)])
		if w.truncate {
			return len(p), nil
		}
		return 0, errOutputTooLarge
	}
	return w.buf.Write(p)
}

func (w *boundedBuffer) String() string { return w.buf.String() }

// lockFile is this namespace's xtables lock: legacy iptables serializes on it, and a
// lock per namespace keeps parallel pod set-ups from contending.
func (b *Backend) lockFile() string {
	if b.lockPath != "" {
		return b.lockPath
	}
	id, err := netns.ID("/proc/thread-self/ns/net")
	if err != nil {
		return filepath.Join(b.lockDir, "xtables.lock")
	}
	return filepath.Join(b.lockDir, fmt.Sprintf("xtables-%d.lock", id))
}

func (b *Backend) save(ctx context.Context, u userNS, f redirect.Family) (map[redirect.Table]*liveTable, error) {
	out, err := b.run(ctx, u, b.tools[f].save, "")
	if err != nil {
		return nil, err
	}
	d, err := ParseSave(out)
	if err != nil {
		return nil, fmt.Errorf("read %s rules: %w", f, err)
	}
	return ours(d), nil
}

// restore writes text with one iptables-restore. Its owner matches make it look
// their uid up as a user name first, their gid as a group name (libxt_owner),
// through NSS, in the pod's network namespace: where the node's passwd or group
// sources may ask a server, it runs with nsswitch.conf masked. (iptables-save
// prints ids as numbers and looks nothing up.)
func (b *Backend) restore(ctx context.Context, u userNS, f redirect.Family, text string) error {
	args := []string{"--noflush"}
	m := masking{nsswitch: !nssIsLocal()}
	if b.mode == ModeLegacy {
		if err := os.MkdirAll(b.lockDir, 0o755); err != nil {
			return fmt.Errorf("create xtables lock dir: %w", err)
		}
		args = append(args, "--wait")
		m.nodeLock = b.masksNodeLock()
	}
	_, err := b.runMasked(ctx, u, m, b.tools[f].restore, text, args...)
	return err
}

// families lists the families to touch: the plan's, and for removal IPv6 too.
func planLayouts(plan *redirect.Plan) (map[redirect.Family][]tableLayout, error) {
	out := map[redirect.Family][]tableLayout{}
	for _, fp := range plan.Families {
		l, err := layout(&fp)
		if err != nil {
			return nil, err
		}
		out[fp.Family] = l
	}
	return out, nil
}

// Apply implements capture.Backend: ApplyWithRollback, its lock released on
// return.
func (b *Backend) Apply(ctx context.Context, plan *redirect.Plan) (bool, error) {
	changed, _, release, err := b.ApplyWithRollback(ctx, plan)
	release()
	return changed, err
}

// ApplyWithRollback is Apply: per family, read our live rules (one save) and,
// unless they already match, write the difference with one restore. A family
// whose namespace holds no table at all (tablesHeld: a pod's new namespace) has
// nothing of ours to read, so only its restore runs, or in nft mode its native
// batch (native_linux.go).
//
// rollback puts back, in each family this apply wrote or may have written, our
// rules as the apply read them before it wrote (revertText): capture.Apply runs
// it when the apply fails after it may have written (a restore commits table by
// table, so one that failed may have written the tables before the one it
// failed at), or when its routing fails after the rules went in. What was there
// is an earlier apply's capture of the same pod (the runtime's ADD, which the
// agent's repair in place or a retried ADD applies over), which reported itself
// done: removing every rule of ours, as the rollback did before, left that pod
// with no capture at all. A family that held nothing of ours is left with
// nothing.
//
// Two applies to one namespace at once would each read the rules before the
// other wrote them and write their difference on top: duplicated hook rules, or
// a rollback that puts back a state the other apply has since replaced after
// reporting success. They happen: the repair controller repairs a pod in place
// while the plugin's ADD is still programming it, and a runtime retries an ADD
// whose first plugin process is still running. So every apply holds the
// namespace's apply lock (lockApply) from before it looks, and the caller
// releases it with release once the rest of its apply (capture.Apply's
// routing) and its rollback, if any, are done: capture.Apply does. The native
// write into a new namespace, the common nft-mode ADD, took no lock (it creates
// its tables exclusively, so of two racing writes one fails whole): another
// apply could then write, and report done, between its write and its
// rollback, which removed what the other wrote, or find its routing in place
// while it was about to remove it. It still creates them exclusively, for an
// apply that takes no lock (one of a build before, during an upgrade):
// refused, it reads what is there and restores what is still missing.
func (b *Backend) ApplyWithRollback(ctx context.Context, plan *redirect.Plan) (changed bool, rollback func(context.Context) error, release func(), err error) {
	release = func() {}
	// found is what of ours each family held before this apply wrote it (nil: no
	// table), for each family it wrote or tried to.
	found := map[redirect.Family]map[redirect.Table]*liveTable{}
	var written []redirect.Family
	rollback = func(ctx context.Context) error {
		if len(written) == 0 {
			return nil
		}
		return b.revert(ctx, written, found)
	}
	layouts, err := planLayouts(plan)
	if err != nil {
		return false, rollback, release, err
	}
	u := podUserNamespace()
	defer u.close()
	r, err := b.lockApply(ctx)
	if err != nil {
		return false, rollback, release, err
	}
	release = r
	timing.Mark(ctx, "iptables-apply-lock")
	// The native batch goes from this process's user namespace, where the kernel
	// refuses the owner matches of a pod with hostUsers: false (podUserNamespace):
	// such a pod's rules are restored in its own.
	native := b.nativeAllowed() && u == ownUserNS
	held := b.tablesHeld()
	timing.Mark(ctx, "iptables-probe")
	for _, f := range []redirect.Family{redirect.IPv4, redirect.IPv6} {
		want, planned := layouts[f]
		if !held[f] && len(diffTables(f, want, nil)) == 0 {
			continue // no table and none wanted (an IPv4-only plan's IPv6)
		}
		var nativeErr error
		if !held[f] && native {
			// A new namespace: the batch iptables-nft-restore would send, sent
			// here (see native_linux.go); what it does not translate is restored.
			if objs, err := translateNative(f, want); err == nil {
				found[f], written = nil, append(written, f)
				nativeErr = b.writeNative(objs)
				timing.Mark(ctx, "iptables-native-"+f.String())
				if nativeErr == nil {
					changed = true
					continue
				}
				// The kernel refused the batch whole: nothing of it is left. An
				// apply that takes no lock may have written the tables since the
				// probe: look again, then restore what is still missing.
				held = b.tablesHeld()
			}
		}
		var live map[redirect.Table]*liveTable
		if held[f] {
			live, err = b.save(ctx, u, f)
			timing.Mark(ctx, "iptables-save-"+f.String())
			if err != nil {
				if !planned {
					continue // no IPv6 support here and none wanted
				}
				return changed, rollback, release, err
			}
		}
		if len(diffTables(f, want, live)) == 0 {
			continue
		}
		found[f] = live
		if !slices.Contains(written, f) {
			written = append(written, f)
		}
		err := b.restore(ctx, u, f, restoreText(want, live))
		timing.Mark(ctx, "iptables-restore-"+f.String())
		if err != nil {
			if nativeErr != nil {
				err = fmt.Errorf("%w (and before it, written natively: %w)", err, nativeErr)
			}
			// A restore commits table by table: one that failed may have
			// written the tables before the one it failed at.
			return true, rollback, release, fmt.Errorf("apply %s rules: %w", f, err)
		}
		if into, ok := ctx.Value(fallbacksKey{}).(*[]error); ok && nativeErr != nil {
			*into = append(*into, fmt.Errorf("%s rules: the native write was refused, the restore wrote them: %w", f, nativeErr))
		}
		changed = true
	}
	return changed, rollback, release, nil
}

// revert puts back, in each family of families, our rules as they were (found),
// reading what is there now: ApplyWithRollback's rollback.
func (b *Backend) revert(ctx context.Context, families []redirect.Family, found map[redirect.Family]map[redirect.Table]*liveTable) error {
	u := podUserNamespace()
	defer u.close()
	var errs []error
	for _, f := range families {
		now, err := b.save(ctx, u, f)
		timing.Mark(ctx, "iptables-save-"+f.String())
		if err != nil {
			errs = append(errs, fmt.Errorf("put back %s rules: %w", f, err))
			continue
		}
		text := revertText(found[f], now)
		if text == "" {
			continue
		}
		err = b.restore(ctx, u, f, text)
		timing.Mark(ctx, "iptables-restore-"+f.String())
		if err != nil {
			errs = append(errs, fmt.Errorf("put back %s rules: %w", f, err))
		}
	}
	return errors.Join(errs...)
}

// lockApply takes the namespace's apply lock (see ApplyWithRollback;
// applylock) and returns its release.
func (b *Backend) lockApply(ctx context.Context) (func(), error) {
	return applylock.Take(ctx)
}

// Verify implements capture.Backend.
func (b *Backend) Verify(ctx context.Context, plan *redirect.Plan) ([]string, error) {
	layouts, err := planLayouts(plan)
	if err != nil {
		return nil, err
	}
	u := podUserNamespace()
	defer u.close()
	var diffs []string
	for _, f := range []redirect.Family{redirect.IPv4, redirect.IPv6} {
		want, planned := layouts[f]
		live, err := b.save(ctx, u, f)
		if err != nil {
			if !planned {
				continue
			}
			return nil, err
		}
		diffs = append(diffs, diffTables(f, want, live)...)
	}
	return diffs, nil
}

// Chains reads our chains back, with the built-in chains' jumps into them, for
// capture.Check. A family whose rules cannot be read is left out but for IPv4:
// ip6tables may be missing where no pod has IPv6.
func (b *Backend) Chains(ctx context.Context) ([]redirect.LiveChain, error) {
	u := podUserNamespace()
	defer u.close()
	var chains []redirect.LiveChain
	for _, f := range []redirect.Family{redirect.IPv4, redirect.IPv6} {
		live, err := b.save(ctx, u, f)
		if err != nil {
			if f == redirect.IPv4 {
				return nil, err
			}
			continue
		}
		for table, lt := range live {
			where := fmt.Sprintf("%s: table %s", f, table)
			jumps := func(lines []DumpLine) []string {
				var to []string
				for _, l := range lines {
					if t := jumpTarget(l.Args); slices.Contains(lt.Chains, t) {
						to = append(to, t)
					}
				}
				return to
			}
			hooks := map[string][]DumpLine{}
			for _, l := range lt.HookLines {
				hooks[l.Chain] = append(hooks[l.Chain], l)
			}
			for hook, lines := range hooks {
				chains = append(chains, redirect.LiveChain{Table: where, Name: hook, Hook: true, Rules: len(lines), Jumps: jumps(lines)})
			}
			for _, c := range lt.Chains {
				chains = append(chains, redirect.LiveChain{Table: where, Name: c, Rules: len(lt.Lines[c]), Jumps: jumps(lt.Lines[c])})
			}
		}
	}
	return chains, nil
}

// Cleanup implements capture.Backend: it removes our chains and our hook rules, and
// where Istio programmed the namespace the rules its layout writes straight into
// built-in chains (istioBuiltinForm), in one restore per family, and leaves every
// other rule alone. Where the ADD writes a new
// namespace natively (nft mode, a known iptables-nft: nativeAllowed), the removal is
// one netlink transaction instead (cleanupNative), and the restore only its fallback.
// The transaction goes from this process's user namespace for a pod with
// hostUsers: false too: the kernel checks the writer's user namespace when an
// owner match is added, not when it is deleted. The save and the restore run in
// the pod's (podUserNamespace), as for the ADD.
func (b *Backend) Cleanup(ctx context.Context) error {
	var errs []error
	u := podUserNamespace()
	defer u.close()
	held := b.tablesHeld()
	for _, f := range []redirect.Family{redirect.IPv4, redirect.IPv6} {
		if !held[f] {
			continue // no table, so nothing of ours
		}
		var nativeErr error
		if b.nativeAllowed() {
			nativeErr = b.cleanupNative(f)
			timing.Mark(ctx, "iptables-native-cleanup-"+f.String())
			if nativeErr == nil {
				continue
			}
			// A rule that may be one of Istio's in a built-in chain is for the
			// restore to judge, from its text: no refusal to report.
			if into, ok := ctx.Value(fallbacksKey{}).(*[]error); ok && !errors.Is(nativeErr, errIstioRulesToRead) {
				*into = append(*into, fmt.Errorf("%s rules: the native removal was refused, the restore removes them: %w", f, nativeErr))
			}
		}
		live, err := b.save(ctx, u, f)
		timing.Mark(ctx, "iptables-save-"+f.String())
		if err != nil {
			if f == redirect.IPv4 {
				errs = append(errs, err)
			}
			continue
		}
		if len(live) == 0 {
			continue
		}
		err = b.restore(ctx, u, f, restoreText(nil, live))
		timing.Mark(ctx, "iptables-restore-"+f.String())
		if err != nil {
			errs = append(errs, fmt.Errorf("remove %s rules: %w", f, err))
		}
	}
	return errors.Join(errs...)
}
