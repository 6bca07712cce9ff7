package agent

import (
	"encoding/base64"
	"fmt"
	"testing"
	"time"
)

// TestTokenRenewalFollowsTheTokensOwnLifetime: renewal comes at half the token's
// lifetime by its own claims, whatever the node's clock says of its expiry, and
// never sooner than tokenRenewMin: a node clock ahead of the API server's made the
// wait zero or negative, a tight loop of TokenRequests and kubeconfig rewrites.
func TestTokenRenewalFollowsTheTokensOwnLifetime(t *testing.T) {
	now := time.Unix(2_000_000_000, 0)
	jwt := func(iat, exp int64) []byte {
		payload := base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, `{"aud":["x"],"exp":%d,"iat":%d,"sub":"system:serviceaccount:istio-system:istio-cni-plugin"}`, exp, iat))
		return []byte("eyJhbGciOiJSUzI1NiJ9." + payload + ".c2ln")
	}
	server := now.Unix() // the API server's clock, when it agrees with the node's
	cases := []struct {
		name    string
		token   []byte
		expires time.Time
		want    time.Duration
	}{
		{"clocks agree", jwt(server, server+86400), now.Add(24 * time.Hour), 12 * time.Hour},
		{"node clock 2 h ahead, token of 1 h", jwt(server-7200, server-7200+3600), now.Add(-time.Hour), 30 * time.Minute},
		{"node clock 2 h behind, token of 1 h", jwt(server+7200, server+7200+3600), now.Add(3 * time.Hour), 30 * time.Minute},
		{"no claims: half of what is left", []byte("opaque"), now.Add(2 * time.Hour), time.Hour},
		{"no claims, expiry already past", []byte("opaque"), now.Add(-time.Minute), tokenRenewMin},
		{"no claims, no expiry", []byte("a.b.c"), time.Time{}, tokenRenewMin},
		{"claims without iat", []byte("h." + base64.RawURLEncoding.EncodeToString([]byte(`{"exp":5}`)) + ".s"), now.Add(20 * time.Minute), 10 * time.Minute},
		{"exp before iat", jwt(server, server-10), now.Add(20 * time.Minute), 10 * time.Minute},
	}
	for _, c := range cases {
		if got := renewIn(c.token, c.expires, now); got != c.want {
			t.Errorf("%s: renewIn = %s, want %s", c.name, got, c.want)
		}
	}
}
