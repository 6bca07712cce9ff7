//go:build !race

package pluginlog

// timingSlack is what the timing bounds of these tests allow beyond the bound
// itself (a loaded machine).
const timingSlack = 200 // ms
