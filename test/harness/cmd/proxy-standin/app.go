package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"time"
)

// runApp answers every request with the pod's name and the caller's address, so a
// client can tell who answered and the server's log shows who called.
func runApp(ctx context.Context, port int) error {
	name := os.Getenv("POD_NAME")
	if name == "" {
		name, _ = os.Hostname()
	}
	srv := &http.Server{Addr: ":" + strconv.Itoa(port), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Printf("app %s: %s %s from %s\n", name, r.Method, r.URL.Path, r.RemoteAddr)
		fmt.Fprintf(w, "hello from %s (you are %s)\n", name, r.RemoteAddr)
	})}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	fmt.Printf("app %s listening on :%d\n", name, port)
	if err := srv.ListenAndServe(); err != http.ErrServerClosed {
		return err
	}
	return nil
}

func get(ctx context.Context, url string, timeout time.Duration, w io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	// A fresh connection per request: each one is a connection the proxy logs.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	_, err = w.Write(body)
	return err
}
