package redirect

// The tests that send packets through the tracer (test/harness/trace, which imports
// this package) and those that build specs with test/harness/specs cannot be part of
// it: they are in package redirect_test and import this package with a dot, so they
// read as if they were. What they need of its insides is lent to them here.

// FieldEnd is one past the last Field.
const FieldEnd = fieldEnd
