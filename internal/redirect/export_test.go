package redirect

// The tests that send packets through the tracer (test/harness/trace, which imports
// this package) cannot be part of it: they are in package redirect_test and import
// this package with a dot, so they read as if they were. What they share with the
// internal tests is lent to them here.

// CasePlan returns the plan of a named spec case (specCases).
var CasePlan = casePlan
