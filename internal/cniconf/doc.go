// Package cniconf owns the node's CNI network configuration as the install-cni agent
// edits it: finding the primary config the way the container runtime does, putting the
// istio-cni entry last in its plugin chain, taking it out again, and writing files so
// that a runtime reading the directory never sees a partial or lost file.
//
// Every pod on the node depends on these files, so the rules are strict:
//
//   - The merge functions (Insert, Remove, Standalone) are pure: bytes in, bytes out.
//     They edit the existing file by splicing inside its "plugins" array, so every
//     other byte (other plugins, key order, unknown keys, indentation, odd spacing)
//     stays as the primary CNI wrote it. Insert on its own output is a no-op.
//   - Anything the runtime would not load, or that we cannot edit without guessing,
//     is refused with an *InvalidError naming the file and what is wrong; the caller
//     then leaves the file untouched.
//   - A .conf is wrapped into NAME.conflist to hold a chain. The original bytes are
//     kept in a hidden sibling file (BackupPath) whose extension libcni ignores, so
//     Uninstall puts back the very file the node had, under its own name.
//   - WriteAtomic writes a temporary file in the same directory, fsyncs it and
//     renames it over the target: readers see the old or the new version, never a mix.
//
// Install and Uninstall combine these into the file operations the agent performs.
package cniconf
