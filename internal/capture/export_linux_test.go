package capture

// RoutingRemovalsTried is how many routing deletions removeRouting has tried.
func RoutingRemovalsTried() int64 { return routingRemovalsTried.Load() }
