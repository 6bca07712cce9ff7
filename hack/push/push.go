package main

import (
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// pushed is the outcome of one push.
type pushed struct {
	ref    name.Tag
	digest v1.Hash
	// unchanged: the registry already held this digest under the tag; nothing was
	// uploaded or rewritten.
	unchanged bool
}

func (p pushed) String() string {
	state := "pushed"
	if p.unchanged {
		state = "unchanged: the registry already holds it under this tag"
	}
	return fmt.Sprintf("%s@%s (%s)", p.ref, p.digest, state)
}

// push puts a under ref, unless the registry already holds the same digest there.
// Blobs the registry already has are not uploaded again.
func (c *registryClient) push(ctx context.Context, ref name.Tag, a artifact) (pushed, error) {
	digest, err := a.digest()
	if err != nil {
		return pushed{}, err
	}
	now, err := c.current(ctx, ref)
	if err != nil {
		return pushed{}, err
	}
	if now == digest {
		return pushed{ref: ref, digest: digest, unchanged: true}, nil
	}
	opts := c.options(ctx)
	if a.index != nil {
		err = remote.WriteIndex(ref, a.index, opts...)
	} else {
		err = remote.Write(ref, a.image, opts...)
	}
	if err != nil {
		return pushed{}, c.explain(ref.Context().Registry, ctx, err, "-timeout "+c.timeout.String())
	}
	return pushed{ref: ref, digest: digest}, nil
}
