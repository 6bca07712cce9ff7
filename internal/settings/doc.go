// Package settings turns a command's flags and environment variables into its
// typed configuration, the same way for every command, so that precedence, --help
// and error messages agree.
//
// A Table lists a command's settings (flag, short flag, environment variables,
// default, usage, and the function that parses a value into the config); Parse
// applies it: a flag overrides its variables, of several variables the last listed
// wins, an empty variable counts as unset, and every error names the flag or
// variable and quotes the value (a long one short, as redirect.Quote does). A
// Table's MaxValueBytes, when set, refuses a longer value of any of its settings
// before it is parsed, naming the setting and the value's length. install-cni and istio-iptables read their flags
// this way.
//
// Reader and FromEnv are the environment-only form for settings that have no flags,
// the agent's controllers' (package repair's REPAIR_*, package taint's TAINT_*).
package settings
