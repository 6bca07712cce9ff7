package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestChartVersionForTag(t *testing.T) {
	for _, tc := range []struct {
		tag, explicit, want, wantErr string
	}{
		{tag: "1.0.0", want: "1.0.0"},
		{tag: "v1.2.3", want: "1.2.3"},
		{tag: "1.2.3-rc.1", want: "1.2.3-rc.1"},
		{tag: "latest", wantErr: `TAG "latest" gives no chart version`},
		{tag: "1.2", wantErr: `TAG "1.2" gives no chart version`},
		{tag: "01.2.3", wantErr: "gives no chart version"},
		{tag: "latest", explicit: "0.3.0", want: "0.3.0"},
		{tag: "1.0.0", explicit: "1.0.0+build5", wantErr: `CHART_VERSION "1.0.0+build5" is not a SemVer version`},
	} {
		got, err := chartVersionFor(tc.tag, tc.explicit)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("chartVersionFor(%q, %q) = %q, %v; want an error with %q", tc.tag, tc.explicit, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("chartVersionFor(%q, %q) = %q, %v; want %q", tc.tag, tc.explicit, got, err, tc.want)
		}
	}
}

func TestSetValuesRewritesOnlyTheImageKeys(t *testing.T) {
	in := "# Registry\nhub: &hub \"\"\n# Tag\ntag: \"\"\nimage: install-cni\ndigest: \"\"\nrepair:\n  hub: \"\"\n  tag: \"\"\ndefaultHub: *hub\n"
	got, err := setValues([]byte(in), chartDefaults{Hub: "r.example.com/mesh", Tag: "1.0.0", Digest: "sha256:abc"})
	if err != nil {
		t.Fatal(err)
	}
	want := "# Registry\nhub: &hub \"r.example.com/mesh\"  # set by make push\n# Tag\ntag: \"1.0.0\"  # set by make push\nimage: install-cni\n" +
		"digest: \"sha256:abc\"  # set by make push\nrepair:\n  hub: \"\"\n  tag: \"\"\ndefaultHub: *hub\n"
	if diff := cmp.Diff(want, string(got)); diff != "" {
		t.Errorf("values (-want +got):\n%s", diff)
	}
	if _, err := setValues([]byte("tag: x\ndigest: y\n"), chartDefaults{}); err == nil || !strings.Contains(err.Error(), `0 top-level "hub" keys`) {
		t.Errorf("values without hub: %v, want an error naming hub", err)
	}
}

// TestNormalizedChartDoesNotDependOnWhenItWasPackaged: helm package dates entries at
// the time it runs; two packagings a second apart give the same bytes once normalized.
func TestNormalizedChartDoesNotDependOnWhenItWasPackaged(t *testing.T) {
	pack := func(when time.Time) []byte {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		zw.ModTime = when
		tw := tar.NewWriter(zw)
		for _, f := range []struct{ name, body string }{{"istio-cni/Chart.yaml", "name: istio-cni\nversion: 1.0.0\n"}, {"istio-cni/values.yaml", "hub: x\n"}} {
			tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.body)), ModTime: when, Uname: "someone"})
			tw.Write([]byte(f.body))
		}
		tw.Close()
		zw.Close()
		return buf.Bytes()
	}
	a, err := normalizeChart(bytes.NewReader(pack(time.Now())))
	if err != nil {
		t.Fatal(err)
	}
	b, err := normalizeChart(bytes.NewReader(pack(time.Now().Add(time.Second))))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("the same chart packaged at two times differs after normalizeChart")
	}
	// The content is kept.
	zr, err := gzip.NewReader(bytes.NewReader(a))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		names = append(names, h.Name+"="+string(body))
		if !h.ModTime.Equal(time.Unix(0, 0)) {
			t.Errorf("%s dated %s, want the epoch", h.Name, h.ModTime)
		}
	}
	if diff := cmp.Diff([]string{"istio-cni/Chart.yaml=name: istio-cni\nversion: 1.0.0\n", "istio-cni/values.yaml=hub: x\n"}, names); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}
	name, version, config, err := chartMetadata(a)
	if err != nil || name != "istio-cni" || version != "1.0.0" || string(config) != `{"name":"istio-cni","version":"1.0.0"}` {
		t.Errorf("chartMetadata = %q %q %s %v", name, version, config, err)
	}
}
