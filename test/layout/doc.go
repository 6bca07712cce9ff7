// Package layout tests the repository's layout: the commands under cmd/ are exactly
// the ones the image ships, and neither they nor any product package under internal/
// link code from test/ (the harness) or hack/ (build and demo tools).
package layout
