//go:build !linux

package timerslack

import "errors"

// MaxThreads bounds how many threads Widen sets.
const MaxThreads = 64

// Widen is Linux only.
func Widen(uint64) (int, error) { return 0, errors.New("timer slack: Linux only") }
