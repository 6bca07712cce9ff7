// Package cnicmd runs a CNI plugin's commands as the CNI specification says: it
// reads the command and its arguments from the environment and the network
// configuration from stdin, checks them and the configuration's version, calls the
// plugin's function for the command, and prints an error as the runtime expects it
// (JSON on stdout, exit status 1).
//
// It does what the CNI library's skel package does, with these differences, the
// first three for a plugin exec'd once per pod, the others as the CNI spec
// (1.1.0) says:
//   - no regular expression: skel's validation package compiles one at every start
//     of the process (with the regexp and unicode tables' initialisation, about
//     0.1 ms of every ADD, measured);
//   - the configuration is decoded once for its name and version;
//   - a command is refused before it runs, not after, when CNI_NETNS is the
//     plugin's own network namespace (skel checks after ADD and DEL, when the
//     rules would already be in the host's namespace, and not for CHECK, which
//     would judge the host's rules as the pod's);
//   - a DEL that the dispatch refuses (the config's name or version, CNI_NETNS the
//     plugin's own namespace) succeeds without running: the ADD was refused the
//     same way, and DEL must succeed when what it would remove is missing;
//   - CNI_PATH is required for GC only (the spec makes it optional for the other
//     commands; skel requires it for all);
//   - the error object printed on stdout has the spec's cniVersion (skel's has
//     none): the config's when the plugin speaks it, else the newest it speaks;
//   - an invalid CNI_* variable is the spec's code 4 with a message that names it
//     and quotes its value (skel's names neither for CNI_CONTAINERID or
//     CNI_IFNAME, and gives 8, none of the spec's codes, for CNI_NETNS the
//     plugin's own namespace).
//
// The environment, stdin and stdout are parameters (Env), so the same dispatch
// runs in a test or in another process than the plugin's own.
package cnicmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"unicode"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/istio-cni/istio-cni/internal/jsontree"
	"github.com/istio-cni/istio-cni/internal/redirect"
)

// CmdArgs are a command's arguments: the environment's CNI_* values and the
// configuration read from stdin.
type CmdArgs struct {
	ContainerID   string
	Netns         string
	IfName        string
	Args          string
	Path          string
	NetnsOverride string
	StdinData     []byte
}

// Funcs are the plugin's commands; a nil one is not supported.
type Funcs struct {
	Add    func(*CmdArgs) error
	Del    func(*CmdArgs) error
	Check  func(*CmdArgs) error
	GC     func(*CmdArgs) error
	Status func(*CmdArgs) error
	// Refused, when set, hears of a command refused after its config was read and
	// before its function ran (the config's name or version, CNI_NETNS the
	// plugin's own namespace), with the error the runtime gets: the plugin's own
	// functions never see those commands.
	Refused func(cmd string, args *CmdArgs, err *types.Error)
}

// Env is where a command comes from and where its output goes.
type Env struct {
	Getenv func(string) string
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// MaxConfigBytes bounds the configuration read from stdin. A chained plugin's
// configuration with its previous result is a few KiB; a larger stdin is refused
// naming the bound rather than read without end.
const MaxConfigBytes = 4 << 20

// maxNameLength bounds a container ID and a network name (a container ID is 64
// hex characters; the spec sets no bound, this one only refuses the absurd).
const maxNameLength = 1024

// maxInterfaceNameLength is the kernel's IFNAMSIZ less the terminating NUL.
const maxInterfaceNameLength = 15

// Main runs the command of this process's environment and exits 1 after printing
// the error, if any, on stdout.
func Main(funcs Funcs, versions version.PluginInfo, about string) {
	if confVersion, err := run(Env{Getenv: os.Getenv, Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}, funcs, versions, about); err != nil {
		if perr := PrintError(os.Stdout, err, ErrorVersion(confVersion, versions)); perr != nil {
			fmt.Fprintln(os.Stderr, "writing the error to stdout:", perr)
		}
		os.Exit(1)
	}
}

// specError is the spec's error object: the CNI library's types.Error has no
// cniVersion, which the spec lists first (every version since 0.1.0 has it).
type specError struct {
	CNIVersion string `json:"cniVersion"`
	*types.Error
}

// PrintError writes e as the spec's error object, of cniVersion: the protocol
// version in use (ErrorVersion).
func PrintError(w io.Writer, e *types.Error, cniVersion string) error {
	out, err := json.MarshalIndent(specError{CNIVersion: cniVersion, Error: e}, "", "    ")
	if err != nil {
		return err
	}
	_, err = w.Write(out)
	return err
}

// ErrorVersion is the version of an error's object: the config's cniVersion when
// the plugin speaks it, else (no config read, one of no version, or of one the
// plugin refuses) the newest the plugin speaks.
func ErrorVersion(confVersion string, versions version.PluginInfo) string {
	supported := versions.SupportedVersions()
	for _, v := range supported {
		if v == confVersion {
			return v
		}
	}
	if len(supported) == 0 {
		return version.Current()
	}
	return supported[len(supported)-1]
}

// required says which commands need a variable.
type required uint8

const (
	forAdd required = 1 << iota
	forCheck
	forDel
	forGC
	forStatus
)

func requiredFor(cmd string) required {
	switch cmd {
	case "ADD":
		return forAdd
	case "CHECK":
		return forCheck
	case "DEL":
		return forDel
	case "GC":
		return forGC
	case "STATUS":
		return forStatus
	}
	return 0
}

// Run runs the command env names and returns its error as a CNI error (nil when
// it succeeded). An empty CNI_COMMAND with about set prints about and the
// supported versions on stderr, as plugins do when run by hand.
func Run(env Env, funcs Funcs, versions version.PluginInfo, about string) *types.Error {
	_, err := run(env, funcs, versions, about)
	return err
}

// run is Run, and returns the config's cniVersion as far as it was read (""
// before, or for a config whose version does not decode), for the version of the
// error's object (ErrorVersion).
func run(env Env, funcs Funcs, versions version.PluginInfo, about string) (confVersion string, _ *types.Error) {
	cmd := env.Getenv("CNI_COMMAND")
	args, err := argsFromEnv(env, cmd)
	if err != nil {
		if err.Code == types.ErrInvalidEnvironmentVariables && cmd == "" && about != "" {
			fmt.Fprintln(env.Stderr, about)
			fmt.Fprintf(env.Stderr, "CNI protocol versions supported: %s\n", strings.Join(versions.SupportedVersions(), ", "))
			return "", nil
		}
		return "", err
	}
	if cmd == "VERSION" {
		if err := versions.Encode(env.Stdout); err != nil {
			return "", types.NewError(types.ErrIOFailure, err.Error(), "")
		}
		return "", nil
	}
	if requiredFor(cmd) == 0 {
		return "", types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("unknown CNI_COMMAND: %v", cmd), "")
	}
	data, rerr := io.ReadAll(io.LimitReader(env.Stdin, MaxConfigBytes+1))
	if rerr != nil {
		return "", types.NewError(types.ErrIOFailure, fmt.Sprintf("error reading from stdin: %v", rerr), "")
	}
	if len(data) > MaxConfigBytes {
		return "", types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("network config on stdin: more than %d bytes", MaxConfigBytes), "")
	}
	args.StdinData = data
	confVersion, err = refusal(cmd, data, args, versions)
	if err != nil {
		if funcs.Refused != nil {
			funcs.Refused(cmd, args, err)
		}
		if cmd == "DEL" {
			// The ADD of this config, or into this namespace, was refused the same
			// way, so nothing of it is there to remove, and the spec asks DEL to
			// succeed then. A failed DEL would also stop the runtime's DEL of the
			// chain here, before the plugins ahead of this one release the pod's
			// address, and leave the sandbox undeletable.
			return confVersion, nil
		}
		return confVersion, err
	}
	var fn func(*CmdArgs) error
	switch cmd {
	case "ADD":
		fn = funcs.Add
	case "DEL":
		fn = funcs.Del
	case "CHECK":
		fn = funcs.Check
	case "GC":
		fn = funcs.GC
	case "STATUS":
		fn = funcs.Status
	}
	if fn == nil {
		return confVersion, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_COMMAND %s is not supported by this plugin", cmd), "")
	}
	if err := fn(args); err != nil {
		var te *types.Error
		if errors.As(err, &te) {
			return confVersion, te
		}
		return confVersion, types.NewError(types.ErrInternal, err.Error(), "")
	}
	return confVersion, nil
}

// refusal is why cmd with the config data is refused before the plugin's function
// runs, nil when it is not: the config's name and version, the command's minimum
// version, and for ADD, DEL and CHECK a CNI_NETNS that is the plugin's own
// namespace (CHECK would judge the node's rules as the pod's; skel lets it run).
// confVersion is the config's cniVersion, once read.
func refusal(cmd string, data []byte, args *CmdArgs, versions version.PluginInfo) (confVersion string, _ *types.Error) {
	confVersion, err := checkConfig(data)
	if err != nil {
		return "", err
	}
	switch cmd {
	case "CHECK":
		err = allowedFrom(cmd, confVersion, "0.4.0", versions)
	case "GC", "STATUS":
		err = allowedFrom(cmd, confVersion, "1.1.0", versions)
	}
	if err != nil {
		return confVersion, err
	}
	if verErr := (&version.Reconciler{}).Check(confVersion, versions); verErr != nil {
		return confVersion, types.NewError(types.ErrIncompatibleCNIVersion, "incompatible CNI versions", verErr.Details())
	}
	if (cmd == "ADD" || cmd == "DEL" || cmd == "CHECK") && !netnsOverridden(args.NetnsOverride) && isOwnNetns(args.Netns) {
		// The spec's "invalid environment variables" (4), naming it; skel's code
		// for it (8) is none of the spec's.
		return confVersion, types.NewError(types.ErrInvalidEnvironmentVariables,
			fmt.Sprintf("CNI_NETNS %s: plugin's netns and netns from CNI_NETNS should not be the same (the runtime's own network namespace, not a container's)", redirect.Quote(args.Netns)), "")
	}
	return confVersion, nil
}

// argsFromEnv reads and checks the CNI_* variables cmd needs.
func argsFromEnv(env Env, cmd string) (*CmdArgs, *types.Error) {
	args := &CmdArgs{
		ContainerID:   env.Getenv("CNI_CONTAINERID"),
		Netns:         env.Getenv("CNI_NETNS"),
		IfName:        env.Getenv("CNI_IFNAME"),
		Args:          env.Getenv("CNI_ARGS"),
		Path:          env.Getenv("CNI_PATH"),
		NetnsOverride: env.Getenv("CNI_NETNS_OVERRIDE"),
	}
	need := requiredFor(cmd)
	vars := []struct {
		name     string
		val      string
		needed   required
		validate func(string) *types.Error
	}{
		{"CNI_COMMAND", cmd, forAdd | forCheck | forDel | forGC | forStatus, nil},
		{"CNI_CONTAINERID", args.ContainerID, forAdd | forCheck | forDel, ValidateContainerID},
		{"CNI_NETNS", args.Netns, forAdd | forCheck, nil},
		{"CNI_IFNAME", args.IfName, forAdd | forCheck | forDel, ValidateInterfaceName},
		// Required for GC alone, as the spec says (skel requires it for every
		// command): this plugin runs no other plugin.
		{"CNI_PATH", args.Path, forGC, nil},
	}
	var missing []string
	for _, v := range vars {
		switch {
		case v.val == "":
			if need&v.needed != 0 || v.name == "CNI_COMMAND" {
				missing = append(missing, v.name)
			}
		case need&v.needed != 0 && v.validate != nil:
			if err := v.validate(v.val); err != nil {
				return nil, err
			}
		}
	}
	if len(missing) > 0 {
		return nil, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("required env variables [%s] missing", strings.Join(missing, ",")), "")
	}
	return args, nil
}

// checkConfig decodes the configuration's name and version, once, and checks the
// name; an absent cniVersion is 0.1.0, as the spec says.
func checkConfig(data []byte) (string, *types.Error) {
	var name, cniVersion string
	var versionErr *types.Error
	if !nameAndVersion(data, &name, &cniVersion) {
		// Not a config whose name and version are strings: encoding/json decides,
		// as skel does, the name first and the version after, each in its words.
		var n struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal(data, &n); err != nil {
			return "", types.NewError(types.ErrDecodingFailure, fmt.Sprintf("error unmarshall network config: %v", err), "")
		}
		var v struct {
			CNIVersion string `json:"cniVersion"`
		}
		if err := json.Unmarshal(data, &v); err != nil {
			versionErr = types.NewError(types.ErrDecodingFailure, fmt.Sprintf("decoding version from network config: %v", err), "")
		}
		name, cniVersion = n.Name, v.CNIVersion
	}
	if name == "" {
		return "", types.NewError(types.ErrInvalidNetworkConfig, "missing network name", "")
	}
	if err := ValidateNetworkName(name); err != nil {
		return "", err
	}
	if versionErr != nil {
		return "", versionErr
	}
	if cniVersion == "" {
		cniVersion = "0.1.0"
	}
	return cniVersion, nil
}

// nameAndVersion reads the config's name and cniVersion without reflection
// (package jsontree: encoding/json's first decode in a process costs more than
// the rest of a pass-through ADD), as encoding/json would: keys matched exactly or
// case-insensitively, a later duplicate winning, null leaving a value as it is.
// It says false, deciding nothing, for anything else (not JSON, not an object, a
// name or version that is not a string).
func nameAndVersion(data []byte, name, cniVersion *string) bool {
	doc, err := jsontree.Parse(data)
	if err != nil {
		return false
	}
	n, nameOK := doc.StringMember("name")
	v, versionOK := doc.StringMember("cniVersion")
	if !nameOK || !versionOK {
		return false
	}
	*name, *cniVersion = n, v
	return true
}

// allowedFrom refuses cmd for a configuration older than min, or newer than every
// version the plugin speaks.
func allowedFrom(cmd, confVersion, min string, versions version.PluginInfo) *types.Error {
	ok, err := version.GreaterThanOrEqualTo(confVersion, min)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, err.Error(), "")
	}
	if !ok {
		return types.NewError(types.ErrIncompatibleCNIVersion, fmt.Sprintf("config version does not allow %s: cniVersion %s, %s needs %s or later", cmd, redirect.Quote(confVersion), cmd, min), "")
	}
	for _, v := range versions.SupportedVersions() {
		ok, err := version.GreaterThanOrEqualTo(v, confVersion)
		if err != nil {
			return types.NewError(types.ErrDecodingFailure, err.Error(), "")
		}
		if ok {
			return nil
		}
	}
	return types.NewError(types.ErrIncompatibleCNIVersion, fmt.Sprintf("plugin version does not allow %s: cniVersion %s is newer than every version the plugin speaks (%s)", cmd, redirect.Quote(confVersion), strings.Join(versions.SupportedVersions(), ", ")), "")
}

func netnsOverridden(v string) bool {
	return strings.EqualFold(v, "true") || v == "1"
}

// isOwnNetns says whether path is this process's network namespace: the same
// namespace inode. A path that cannot be read is not (DEL may name a namespace
// already gone; ADD fails on it later, naming it).
func isOwnNetns(path string) bool {
	if path == "" {
		return false
	}
	var target, own syscall.Stat_t
	if syscall.Stat(path, &target) != nil || syscall.Stat("/proc/self/ns/net", &own) != nil {
		return false
	}
	return target.Dev == own.Dev && target.Ino == own.Ino
}

// validName is the spec's rule for a container ID and a network name: a letter or
// digit, then letters, digits, '_', '.' and '-'.
func validName(s string) bool {
	if s == "" || len(s) > maxNameLength {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '_' && c != '.' && c != '-') {
			return false
		}
	}
	return true
}

// nameRule is the spec's rule for a container ID and a network name, as errors
// state it.
const nameRule = "a letter or digit, then letters, digits, '_', '.' and '-'"

// ValidateContainerID checks CNI_CONTAINERID. Its errors are the spec's "invalid
// environment variables" (4), whose message must name the variable (skel's does
// not): they name it and quote the value.
func ValidateContainerID(id string) *types.Error {
	if id == "" {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_CONTAINERID is empty", "")
	}
	if len(id) > maxNameLength {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_CONTAINERID is %d bytes, longer than the limit of %d", len(id), maxNameLength), redirect.Quote(id))
	}
	if !validName(id) {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_CONTAINERID %s: invalid characters in containerID (%s)", redirect.Quote(id), nameRule), "")
	}
	return nil
}

// ValidateNetworkName checks the configuration's name.
func ValidateNetworkName(name string) *types.Error {
	if name == "" {
		return types.NewError(types.ErrInvalidNetworkConfig, "missing network name:", "")
	}
	if len(name) > maxNameLength {
		return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("network name is %d bytes, longer than the limit of %d", len(name), maxNameLength), redirect.Quote(name))
	}
	if !validName(name) {
		return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("invalid characters found in network name %s (%s)", redirect.Quote(name), nameRule), "")
	}
	return nil
}

// ValidateInterfaceName checks CNI_IFNAME as the kernel would: not empty, at most
// 15 bytes, not "." or "..", no '/', ':' or white space. Its errors name the
// variable and quote the value (see ValidateContainerID).
func ValidateInterfaceName(name string) *types.Error {
	bad := func(why string) *types.Error {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_IFNAME %s: %s", redirect.Quote(name), why), "")
	}
	switch {
	case name == "":
		return bad("interface name is empty")
	case len(name) > maxInterfaceNameLength:
		return bad(fmt.Sprintf("interface name is too long (%d bytes; the kernel takes at most %d)", len(name), maxInterfaceNameLength))
	case name == "." || name == "..":
		return bad("interface name is . or ..")
	}
	for _, r := range name {
		if r == '/' || r == ':' || unicode.IsSpace(r) {
			return bad("interface name contains / or : or whitespace characters")
		}
	}
	return nil
}
