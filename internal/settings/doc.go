// Package settings reads and checks the settings the agent's controllers take from
// environment variables (package repair's REPAIR_*, package taint's TAINT_*), so that
// every one of them parses a value the same way and every error names the variable
// to change.
package settings
