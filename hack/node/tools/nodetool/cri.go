package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func dial(endpoint string) (runtimeapi.RuntimeServiceClient, func(), error) {
	sock, ok := strings.CutPrefix(endpoint, "unix://")
	if !ok {
		return nil, nil, fmt.Errorf("endpoint %q: only unix:// is supported", endpoint)
	}
	conn, err := grpc.NewClient("passthrough:///"+sock,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}))
	if err != nil {
		return nil, nil, fmt.Errorf("connect %s: %w", endpoint, err)
	}
	return runtimeapi.NewRuntimeServiceClient(conn), func() { conn.Close() }, nil
}

// sandboxes lists every pod sandbox of the runtime.
func sandboxes(ctx context.Context, rt runtimeapi.RuntimeServiceClient) ([]*runtimeapi.PodSandbox, error) {
	resp, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, fmt.Errorf("list pod sandboxes: %w", err)
	}
	return resp.Items, nil
}

// listPods prints one line per pod sandbox: id, state, namespace/name.
func listPods(ctx context.Context, rt runtimeapi.RuntimeServiceClient) error {
	items, err := sandboxes(ctx, rt)
	if err != nil {
		return err
	}
	for _, s := range items {
		fmt.Printf("%s\t%s\t%s/%s\n", s.Id, s.State, s.Metadata.GetNamespace(), s.Metadata.GetName())
	}
	return nil
}

// sweep stops and removes every pod sandbox. Stopping runs the CNI DEL and removes
// the network namespace, so it is the last chance to undo what pods did to the host
// once kubelet is gone. It prints the number of sandboxes removed.
func sweep(ctx context.Context, rt runtimeapi.RuntimeServiceClient) error {
	items, err := sandboxes(ctx, rt)
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range items {
		pod := s.Metadata.GetNamespace() + "/" + s.Metadata.GetName()
		if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: s.Id}); err != nil {
			errs = append(errs, fmt.Errorf("stop sandbox %s of %s: %w", s.Id, pod, err))
			continue
		}
		if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: s.Id}); err != nil {
			errs = append(errs, fmt.Errorf("remove sandbox %s of %s: %w", s.Id, pod, err))
		}
	}
	fmt.Println(len(items))
	return errors.Join(errs...)
}

// status prints the runtime's conditions as the CRI Status call reports them, one
// per line: type, true/false, reason, message. NetworkReady is where the runtime
// reports its CNI plugins' STATUS.
func status(ctx context.Context, rt runtimeapi.RuntimeServiceClient) error {
	resp, err := rt.Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	for _, c := range resp.GetStatus().GetConditions() {
		fmt.Printf("%s\t%t\t%s\t%s\n", c.Type, c.Status, c.Reason, strings.ReplaceAll(c.Message, "\n", " "))
	}
	return nil
}
