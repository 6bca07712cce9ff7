// Package lease lets one replica of many do a job: leader election on a
// coordination.k8s.io Lease with client-go's leaderelection, campaigning again
// after every lost term, and releasing the Lease on shutdown so that another
// replica takes over at once. The agent's cluster-wide controllers (the node
// readiness taint, the Multus NetworkAttachmentDefinitions) each hold their own
// Lease through it, and read its settings under their own variable names.
package lease
