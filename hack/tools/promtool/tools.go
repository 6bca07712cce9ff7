//go:build tools

// Package tools pins promtool, which the metrics tests run on the agent's
// /metrics (promtool check metrics).
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
