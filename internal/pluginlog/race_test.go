//go:build race

package pluginlog

// timingSlack is what the timing bounds of these tests allow beyond the bound
// itself: under the race detector every Report costs several times as much.
const timingSlack = 1000 // ms
