package plugin

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// configKeys are every key decodeJSON reads, with their nesting, in the case the
// struct tags give; the tests also try other cases.
var configKeys = []string{
	"cniVersion", "name", "type", "capabilities", "ipam", "ipam.type", "dns", "dns.nameservers", "dns.domain",
	"dns.search", "dns.options", "cni.dev/valid-attachments", "runtimeConfig", "prevResult",
	"plugin_log_level", "cni_agent_run_dir", "exclude_namespaces", "pod_namespace", "native_nftables",
	"ambient_enabled", "enablement_selectors", "log_level", "log_uds_address", "hostNSEnterExec",
	"kubernetes", "kubernetes.kubeconfig", "kubernetes.k8s_api_root", "kubernetes.exclude_namespaces",
	"kubernetes.cni_bin_dir", "kubernetes.intercept_type", "kubernetes.node_name",
	"kubernetes.netns_setup_executable", "kubernetes.iptables_script", "config_schema", "iptables_mode",
	"pod_lookup", "pod_lookup.retries", "pod_lookup.interval", "extra_bypass_uids", "log_socket", "log_file",
	"log_as_json",
}

// sampleValues are one or more of each JSON kind, including the edges of the
// integer types the config has.
var sampleValues = []string{
	`null`, `true`, `false`, `0`, `1`, `-1`, `1.5`, `1e3`, `4294967295`, `4294967296`, `9223372036854775808`,
	`""`, `"x"`, `"caf\u00e9"`, "\"\xff\"", `[]`, `[null]`, `["a","b"]`, `[1,2]`, `[true]`, `[{}]`, `[{"containerID":"c","ifname":"eth0"}]`,
	`[{"containerID":1}]`, `{}`, `{"a":true}`, `{"a":1}`, `{"type":"host-local"}`, `{"x":[1]}`,
}

// nest puts value at key's path in an object, with a name the config needs.
func nest(key, value string) string {
	parts := strings.Split(key, ".")
	if key == "cni.dev/valid-attachments" {
		parts = []string{key}
	}
	doc := value
	for i := len(parts) - 1; i >= 0; i-- {
		doc = fmt.Sprintf(`{%q:%s}`, parts[i], doc)
	}
	return doc
}

// decodeStd is the decode decodeJSON replaces: encoding/json into the same
// struct, as the plugin decoded its config before.
func decodeStd(data []byte) (rawConfig, error) {
	var raw rawConfig
	err := json.Unmarshal(data, &raw)
	return raw, err
}

// sameDecode fails t unless decodeJSON and encoding/json give the same rawConfig,
// or errors that configJSONError words the same. encoding/json names a key of the
// embedded types.NetConf with the Go field's name in front ("NetConf.name");
// decodeJSON names the key alone.
func sameDecode(t *testing.T, doc []byte) {
	t.Helper()
	want, wantErr := decodeStd(doc)
	var got rawConfig
	gotErr := decodeJSON(doc, &got)
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("%s: decodeJSON error %v, encoding/json %v", doc, gotErr, wantErr)
	}
	if wantErr != nil {
		w := strings.ReplaceAll(configJSONError(wantErr).Error(), `"NetConf.`, `"`)
		if g := configJSONError(gotErr).Error(); g != w {
			t.Fatalf("%s: error\n got %s\nwant %s", doc, g, w)
		}
		return
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(rawConfig{})); diff != "" {
		t.Fatalf("%s: decodes differently (-encoding/json +decodeJSON):\n%s", doc, diff)
	}
}

// configDocs are the documents both tests start from: every key with every
// sample value, in its own case and folded; duplicates, merges and nulls after
// values; the repository's example config.
func configDocs(t testing.TB) [][]byte {
	var docs [][]byte
	for _, k := range configKeys {
		for _, v := range sampleValues {
			docs = append(docs, []byte(nest(k, v)), []byte(nest(strings.ToUpper(k), v)))
		}
	}
	for _, extra := range []string{
		`null`, `[]`, `"config"`, `1`, `{}`, `{"name":"a","name":"b"}`, `{"name":"a","NAME":"b","Name":null}`,
		`{"kubernetes":{"kubeconfig":"/a"},"kubernetes":{"node_name":"n"}}`,
		`{"kubernetes":{"kubeconfig":"/a"},"kubernetes":null}`,
		`{"pod_lookup":{"retries":2},"pod_lookup":{"interval":"1s"}}`,
		`{"exclude_namespaces":["a"],"exclude_namespaces":["b","c"]}`,
		`{"extra_bypass_uids":[1,"x",-1]}`,
		`{"capabilities":{"portMappings":true},"capabilities":{"bandwidth":false}}`,
		`{"plugin_log_level":1,"iptables_mode":true}`,
		`{"config_schema":9,"exclude_namespaces":{"a":1}}`,
		`{"plugin_log_level":1,"config_schema":"2"}`, `{"plugin_log_level":1,"config_schema":1.5}`,
		`{"prevResult": {"cniVersion":"1.0.0","ips":[]} ,"runtimeConfig" : [1] }`,
		`{"name":"x",}`, `{"name" "x"}`, `{"name":"x"`,
	} {
		docs = append(docs, []byte(extra))
	}
	example, err := os.ReadFile("testdata/config.json")
	if err != nil {
		t.Fatal(err)
	}
	return append(docs, example)
}

func TestDecodeJSONAgreesWithEncodingJSON(t *testing.T) {
	for _, doc := range configDocs(t) {
		sameDecode(t, doc)
	}
}

func FuzzDecodeJSONAgreesWithEncodingJSON(f *testing.F) {
	for _, doc := range configDocs(f) {
		f.Add(doc)
	}
	f.Fuzz(func(t *testing.T, doc []byte) { sameDecode(t, doc) })
}
