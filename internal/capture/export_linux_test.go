package capture

// RoutingOf is routingOf, for the tests of package capture_test.
var RoutingOf = routingOf
