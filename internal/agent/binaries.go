package agent

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/istio-cni/istio-cni/internal/cniconf"
	"github.com/istio-cni/istio-cni/internal/livetemp"
)

// binary is one file of the image's binary directory, with its digest so that an
// installed copy can be compared without reading the source again.
type binary struct {
	name string // in the source dir
	src  string
	size int64
	sum  [sha256.Size]byte
}

// tempInfix marks our temporary files in a bin dir; a crash may leave one behind
// and the next start removes it.
const tempInfix = ".install-tmp-"

// sourceBinaries lists the regular files of the source directory, minus the
// skipped ones. The plugin itself must be there.
func sourceBinaries(s *Settings) ([]binary, error) {
	entries, err := os.ReadDir(s.BinSourceDir)
	if err != nil {
		return nil, fmt.Errorf("CNI_BIN_SOURCE_DIR: %w", err)
	}
	var out []binary
	for _, e := range entries {
		if !e.Type().IsRegular() || strings.HasPrefix(e.Name(), ".") || slices.Contains(s.SkipBinaries, e.Name()) {
			continue
		}
		b := binary{name: e.Name(), src: filepath.Join(s.BinSourceDir, e.Name())}
		if b.size, b.sum, err = digest(b.src); err != nil {
			return nil, fmt.Errorf("CNI_BIN_SOURCE_DIR: %w", err)
		}
		out = append(out, b)
	}
	if !slices.ContainsFunc(out, func(b binary) bool { return b.name == PluginType }) {
		return nil, fmt.Errorf("CNI_BIN_SOURCE_DIR %s holds no %s binary (or SKIP_CNI_BINARIES skips it)", s.BinSourceDir, PluginType)
	}
	return out, nil
}

func digest(path string) (int64, [sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	f, err := os.Open(path)
	if err != nil {
		return 0, sum, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return 0, sum, fmt.Errorf("read %s: %w", path, err)
	}
	copy(sum[:], h.Sum(nil))
	return n, sum, nil
}

// installedAs reports whether path holds exactly b.
func (b binary) installedAs(path string) bool {
	fi, err := os.Stat(path)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != b.size || fi.Mode().Perm()&0o111 == 0 {
		return false
	}
	_, sum, err := digest(path)
	return err == nil && sum == b.sum
}

// install puts b into dir under the prefixed name unless an identical copy is
// there; another file at that name is replaced only when mayReplace(target) says
// so. The copy goes to a temporary file in the same directory, is fsynced and
// renamed over the target: a runtime exec'ing the plugin meanwhile runs either the
// old or the new file (never a partial one), and the running old inode is never
// written to, so nobody gets ETXTBSY.
func (b binary) install(dir, prefix string, mayReplace func(target string) bool) (changed bool, err error) {
	target := filepath.Join(dir, prefix+b.name)
	if b.installedAs(target) {
		return false, nil
	}
	if _, err := os.Lstat(target); err == nil && !mayReplace(target) {
		return false, nil
	}
	if err := copyAtomic(b.src, target, 0o755); err != nil {
		return false, err
	}
	return true, nil
}

// isExecutable reports whether path is a regular file the runtime can exec: a
// binary, ours or another installer's.
func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// uninstall removes the prefixed copy of b from dir if it is ours (identical); a
// file someone else put there under that name stays.
func (b binary) uninstall(dir, prefix string) error {
	target := filepath.Join(dir, prefix+b.name)
	if !b.installedAs(target) {
		return nil
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", target, err)
	}
	return nil
}

// copyAtomic copies src over target through cniconf.ReplaceAtomic (temporary file
// in target's directory, fsync, rename; target itself is never written, so a
// runtime exec'ing it never gets ETXTBSY). The copy gets mode, not the mode of the
// file it replaces as cniconf.WriteAtomic would keep: an installed binary must be
// executable.
func copyAtomic(src, target string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("install %s: %w", target, err)
	}
	defer in.Close()
	err = cniconf.ReplaceAtomic(target, tempInfix, mode, func(w io.Writer) error {
		if _, err := io.Copy(w, in); err != nil {
			return fmt.Errorf("copy: %w", err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("install %s: %w", target, err)
	}
	return nil
}

// removeStaleTemps deletes temporary files a crashed agent left in dir, and not
// those a live writer holds (livetemp).
func removeStaleTemps(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") && strings.Contains(e.Name(), tempInfix) {
			livetemp.RemoveAbandoned(filepath.Join(dir, e.Name()))
		}
	}
}
