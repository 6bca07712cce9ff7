// Package timing records where a command's time goes, phase by phase, for the
// plugin's log line: the plugin is exec'd once per pod, so its log is the one place
// that can say, for a slow ADD on a node, whether the time went to the pod lookup, a
// lock, or the rules. Code deep in the call chain (a backend's restore) marks its
// phases through the context, and costs nothing when no recorder is there.
package timing
