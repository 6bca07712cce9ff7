package cniconf

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/istio-cni/istio-cni/internal/livetemp"
	"github.com/istio-cni/istio-cni/internal/regularfile"
)

// ErrChanged means a file changed between our read and our write; the caller reads
// it again and retries rather than overwrite what another writer just put there.
var ErrChanged = errors.New("changed while we were editing it")

// ReadConfig reads a config file, refusing one larger than MaxConfigSize before
// reading it whole, and anything but a regular file (a FIFO would block the reader
// until someone writes to it; it is opened without blocking and refused).
func ReadConfig(path string) ([]byte, error) {
	f, err := regularfile.Open(path, os.O_RDONLY, 0)
	var nr *regularfile.NotRegularError
	if errors.As(err, &nr) {
		return nil, invalid(path, "is not a regular file (%s)", nr.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("read CNI config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxConfigSize+1))
	if err != nil {
		return nil, fmt.Errorf("read CNI config %s: %w", path, err)
	}
	if len(data) > MaxConfigSize {
		return nil, invalid(path, "more than the %d bytes a CNI config may have", MaxConfigSize)
	}
	return data, nil
}

// SameContent reports whether the regular file at path holds exactly data, reading
// no more than len(data)+1 bytes of it.
func SameContent(path string, data []byte) bool {
	f, err := regularfile.Open(path, os.O_RDONLY, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || fi.Size() != int64(len(data)) {
		return false
	}
	cur, err := io.ReadAll(io.LimitReader(f, int64(len(data))+1))
	return err == nil && bytes.Equal(cur, data)
}

// WriteAtomic replaces path with data so that a reader sees either the old file or
// the new one, whole: data goes to a temporary file in the same directory (named
// with an extension the runtime ignores), is synced, then renamed over path. An
// existing file keeps its permissions and, where the process may set them
// (CAP_CHOWN), its owner and group; a new one gets mode. When path is a symbolic
// link (a primary CNI that keeps its config elsewhere and links it into the
// directory), the file it points to is replaced and the link stays.
func WriteAtomic(path string, data []byte, mode os.FileMode) error {
	owner := -1
	var group int
	if target, err := filepath.EvalSymlinks(path); err == nil {
		path = target
		fi, err := os.Stat(path)
		if err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		mode = fi.Mode().Perm()
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			owner, group = int(st.Uid), int(st.Gid)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("write %s: %w", path, err)
	}
	err := ReplaceAtomic(path, ".tmp-", mode, func(w io.Writer) error {
		_, err := w.Write(data)
		if err != nil || owner < 0 {
			return err
		}
		f, ok := w.(*os.File)
		if !ok {
			return nil
		}
		// Best effort: without CAP_CHOWN the new file is the agent's (root's, as the
		// chart runs it), which every runtime reads alike.
		if err := f.Chown(owner, group); err != nil && !errors.Is(err, fs.ErrPermission) {
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// ReplaceAtomic is WriteAtomic's mechanism for a caller with its own content and
// mode (the agent's binary copies): fill writes the content into a new temporary
// file "."+base(path)+tempInfix+random in path's directory, which then gets mode
// (whatever the umask), is synced and renamed over path. The file at path is never
// opened for writing: a reader sees the old or the new file whole, and a program
// running from the old one keeps its inode (no ETXTBSY). On error the temporary
// file is removed; a crash may leave it, to be recognised by tempInfix. It is
// locked until after the rename (livetemp), so that a cleanup removes it only once
// its writer is dead.
func ReplaceAtomic(path, tempInfix string, mode os.FileMode, fill func(w io.Writer) error) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	pattern := "." + base + tempInfix + "*"
	f, release, err := livetemp.CreateTemp(dir, pattern)
	if err != nil {
		return err
	}
	defer release()
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
			err = namePattern(err, tmp, filepath.Join(dir, pattern))
		}
	}()
	if err = fill(f); err != nil {
		return err
	}
	// Chmod after creation: CreateTemp's 0600 and the umask would otherwise decide.
	if err = f.Chmod(mode); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	// Closed before the rename: a runtime exec'ing a binary still open for writing
	// gets ETXTBSY.
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	// The rename is durable only once the directory is synced; a crash before that may
	// bring back the old file, which is still whole.
	syncDir(dir)
	return nil
}

// namePattern names the removed temporary file tmp in err by its pattern, as a
// failed os.CreateTemp does: its random name would make the same failure (a full
// disk, a busy path) a new error at every retry, and the agent logs an error once
// until it changes.
func namePattern(err error, tmp, pattern string) error {
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Path == tmp {
		pe.Path = pattern
	}
	var le *os.LinkError
	if errors.As(err, &le) && le.Old == tmp {
		le.Old = pattern
	}
	return err
}

// syncDir makes the renames and removals done in dir durable, as far as the file
// system lets it (best effort: a failure leaves them to the next commit). A
// variable so that a test can see when it runs.
var syncDir = func(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

// backupPrefix starts the hidden file holding a primary config's original bytes.
// Its ".orig" extension keeps libcni (which reads .conf, .conflist and .json only)
// and every runtime from loading it.
const backupPrefix = ".istio-cni."

// BackupPath is where the original bytes of the config named name are kept, for
// example /etc/cni/net.d/.istio-cni.10-flannel.conf.orig.
func BackupPath(dir, name string) string {
	return filepath.Join(dir, backupPrefix+name+".orig")
}

// backupNames lists the original names a config written as name may have had: a
// .conflist may be a .conf or .json we wrapped.
func backupNames(name string) []string {
	names := []string{name}
	if base, ok := strings.CutSuffix(name, ".conflist"); ok {
		names = append(names, base+".conf", base+".json")
	}
	return names
}

// FindBackup returns the original kept for the config now named name, or nil.
func FindBackup(dir, name string) (*Original, error) {
	for _, n := range backupNames(name) {
		data, err := ReadConfig(BackupPath(dir, n))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read backup of %s: %w", n, err)
		}
		return &Original{Name: n, Data: data}, nil
	}
	return nil, nil
}

func removeBackups(dir, name string) error {
	for _, n := range backupNames(name) {
		if err := os.Remove(BackupPath(dir, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove backup of %s: %w", n, err)
		}
	}
	return nil
}

// Install inserts entry into the primary config dir/name and returns the path of
// the file that now holds it (NAME.conflist when name was a .conf or .json).
//
// Before the first insert into the primary's own version of the file, its bytes go
// to BackupPath so that Uninstall can put them back. A file that already holds
// exactly our output is not rewritten, so that a watcher on the directory does not
// wake itself up. A wrapped .conf is removed only after its .conflist is in place:
// in between, the runtime still finds the .conf first and the node keeps working.
// A list the runtime would run more plugins after (its plugin directory, see
// chainInDir), or a .conf that would become one, is left as it is.
func Install(dir, name string, entry []byte) (string, error) {
	data, mode, err := readForEdit(dir, name, "install into")
	if err != nil {
		return "", err
	}
	if err := chainInDir(filepath.Join(dir, name), data); err != nil {
		return "", err
	}
	out, outName, err := Insert(data, name, entry)
	if err != nil {
		return "", err
	}
	_, typ, _ := parseEntry(entry) // checked by Insert
	has, _ := HasType(data, name, typ)
	outPath := filepath.Join(dir, outName)
	if outName == name && bytes.Equal(out, data) {
		return outPath, nil
	}
	if outName != name {
		// Read alone as a .conf, as a list with the plugin dir of its name.
		if err := chainInDir(outPath, out); err != nil {
			return "", err
		}
		if target, err := os.Readlink(filepath.Join(dir, name)); err == nil {
			// The wrap would put a copy in the link's place: the primary's later
			// writes to target would no longer reach the runtime, and the uninstall
			// would put back a regular file.
			return "", invalid(name, "is a symbolic link to %s, and wrapping it into %s would replace the link with a copy that the primary CNI's writes to %s no longer reach; link a .conflist instead", target, outName, target)
		}
		if err := notAnother(outPath, name, typ); err != nil {
			return "", err
		}
		if err := sortsFirstAs(dir, name, outName); err != nil {
			return "", err
		}
	}
	if !has {
		if err := removeBackups(dir, outName); err != nil {
			return "", err
		}
		if err := WriteAtomic(BackupPath(dir, name), data, 0o600); err != nil {
			return "", fmt.Errorf("keep original of %s: %w", name, err)
		}
	}
	if err := replace(dir, name, data, outName, out, mode, "wrapping it into "+outName); err != nil {
		return "", err
	}
	return outPath, nil
}

// notAnother refuses to wrap name into path (its NAME.conflist) when path is there
// and is not an earlier wrap of ours (a list holding an entry of type typ): it is
// another config, which the wrap would replace and the uninstall then delete.
func notAnother(path, name, typ string) error {
	data, err := ReadConfig(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err == nil {
		if ours, _ := HasType(data, filepath.Base(path), typ); ours {
			return nil
		}
	}
	return invalid(name, "wrapping it into a list would replace %s, another config already there; remove or rename one of the two", filepath.Base(path))
}

// sortsFirstAs refuses to wrap name into outName (a .conf into its .conflist, which
// sorts later) when a config of dir sorts between the two in byte order (NAME.conf.json,
// NAME.conf-backup.json): the runtime, which loads the first config, would load that
// one instead of the wrapped primary.
func sortsFirstAs(dir, name, outName string) error {
	after, err := ConfigsAfter(dir, name)
	if err != nil {
		return err
	}
	for _, f := range after {
		if f < outName {
			return invalid(name, "wrapping it into %s would sort it after %s, which the runtime would then load instead; rename or remove %s", outName, f, f)
		}
	}
	return nil
}

// Uninstall takes our entry out of dir/name, putting back the original file when
// the config is still what Install made of it, and drops the backup. It returns the
// path of the file that now holds the primary's config.
func Uninstall(dir, name string) (string, error) {
	return UninstallType(dir, name, PluginType)
}

// UninstallType is Uninstall for entries of type typ (a prefixed plugin name,
// CNI_BINARIES_PREFIX).
//
// A wrapped .conf whose name is taken again (its CNI wrote it anew since the
// wrap: flannel's init container at every restart) is not put back over that
// newer version, which the runtime loads first anyway: only the wrap is removed.
// A config that is gone (its CNI removed it) has its backup removed, of no use any
// more, and the error says it is gone (fs.ErrNotExist).
func UninstallType(dir, name, typ string) (string, error) {
	data, mode, err := readForEdit(dir, name, "uninstall from")
	if errors.Is(err, fs.ErrNotExist) {
		if rerr := removeBackups(dir, name); rerr != nil {
			return "", errors.Join(err, rerr)
		}
		return "", err
	}
	if err != nil {
		return "", err
	}
	orig, err := FindBackup(dir, name)
	if err != nil {
		return "", err
	}
	out, outName, changed, err := RemoveType(data, name, orig, typ)
	if err != nil {
		return "", err
	}
	outPath := filepath.Join(dir, outName)
	if _, err := os.Lstat(outPath); changed && outName != name && err == nil {
		path := filepath.Join(dir, name)
		if err := unchanged(path, data); err != nil {
			return "", err
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("remove %s, %s being there again: %w", name, outName, err)
		}
		syncDir(dir)
		return outPath, removeBackups(dir, name)
	}
	if changed {
		// The restored .conf sorts before the .conflist, so the runtime already uses
		// it if we stop between writing it and removing the .conflist.
		if err := replace(dir, name, data, outName, out, mode, "restoring "+outName); err != nil {
			return "", err
		}
	}
	return outPath, removeBackups(dir, name)
}

// readForEdit reads the config dir/name and its permissions; op ("install into")
// says what for in the error when the file is not there.
func readForEdit(dir, name, op string) ([]byte, fs.FileMode, error) {
	path := filepath.Join(dir, name)
	fi, err := os.Stat(path)
	if err != nil {
		return nil, 0, fmt.Errorf("%s CNI config: %w", op, err)
	}
	data, err := ReadConfig(path)
	if err != nil {
		return nil, 0, err
	}
	return data, fi.Mode().Perm(), nil
}

// replace writes out as dir/outName in place of dir/name, read earlier as data,
// unless the file changed since. When the name changes, dir/name is removed once
// the new file is in place; after says, in that error, what became of it.
func replace(dir, name string, data []byte, outName string, out []byte, mode fs.FileMode, after string) error {
	path := filepath.Join(dir, name)
	if err := unchanged(path, data); err != nil {
		return err
	}
	if err := WriteAtomic(filepath.Join(dir, outName), out, mode); err != nil {
		return err
	}
	if outName != name {
		// Its writer may have written name again while ours was written (a daemon
		// rewriting its .conf): removed, that version would be lost for good. Kept,
		// it sorts before outName as before, and the caller edits it anew.
		if err := unchanged(path, data); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove %s after %s: %w", name, after, err)
		}
		// Durable as the rename: a wrapped .conf that a power loss brought back would
		// sort before its .conflist, and the runtime would load it without our entry.
		syncDir(dir)
	}
	return nil
}

// unchanged narrows the window in which another writer's update could be lost:
// right before our rename, the file must still hold what we edited.
func unchanged(path string, data []byte) error {
	now, err := ReadConfig(path)
	if err != nil {
		return err
	}
	if !bytes.Equal(now, data) {
		return fmt.Errorf("%s: %w", filepath.Base(path), ErrChanged)
	}
	return nil
}
