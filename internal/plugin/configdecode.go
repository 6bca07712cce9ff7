package plugin

import (
	"reflect"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/istio-cni/istio-cni/internal/jsontree"
)

// decodeJSON fills raw from the config's JSON as encoding/json.Unmarshal would
// (key matching exact first, then case-insensitive; a later duplicate key wins,
// and a repeated object merges into the earlier; null clears a pointer), but
// without reflection: the plugin's first reflective decode costs more than all
// else it does for a pod it passes through (package jsontree).
// TestDecodeJSONAgreesWithEncodingJSON holds the two to the same values and the
// same errors. A type error is the first one in the document, as encoding/json's
// is; encoding/json's own errors (*json.UnmarshalTypeError, *json.SyntaxError)
// are returned, so configJSONError words them as before.
func decodeJSON(data []byte, raw *rawConfig) error {
	doc, err := jsontree.Document(data)
	if err != nil {
		return err
	}
	d := &jsontree.Decoder{}
	d.Object("", doc, reflect.TypeFor[rawConfig](), func(k string, v jsontree.Value) { decodeMember(d, raw, k, v) })
	return d.Err()
}

func decodeMember(d *jsontree.Decoder, raw *rawConfig, k string, v jsontree.Value) {
	is := jsontree.Is
	str := func(field string, to **string) { jsontree.Ptr(v, to, func(s *string) { d.String(field, v, s) }) }
	boolean := func(field string, to **bool) { jsontree.Ptr(v, to, func(b *bool) { d.Bool(field, v, b) }) }
	strs := func(field string, e jsontree.Value, s *string) { d.String(field, e, s) }
	switch {
	// types.NetConf's (the embedded struct's keys lose to ours: prevResult).
	case is(k, "cniVersion"):
		d.String("cniVersion", v, &raw.CNIVersion)
	case is(k, "name"):
		d.String("name", v, &raw.Name)
	case is(k, "type"):
		d.String("type", v, &raw.Type)
	case is(k, "capabilities"):
		jsontree.Map(d, "capabilities", v, &raw.Capabilities, func(e jsontree.Value, b *bool) { d.Bool("capabilities", e, b) })
	case is(k, "ipam"):
		d.Object("ipam", v, reflect.TypeFor[types.IPAM](), func(k string, v jsontree.Value) {
			if is(k, "type") {
				d.String("ipam.type", v, &raw.IPAM.Type)
			}
		})
	case is(k, "dns"):
		d.Object("dns", v, reflect.TypeFor[types.DNS](), func(k string, v jsontree.Value) {
			switch {
			case is(k, "nameservers"):
				jsontree.List(d, "dns.nameservers", v, &raw.DNS.Nameservers, func(e jsontree.Value, s *string) { strs("dns.nameservers", e, s) })
			case is(k, "domain"):
				d.String("dns.domain", v, &raw.DNS.Domain)
			case is(k, "search"):
				jsontree.List(d, "dns.search", v, &raw.DNS.Search, func(e jsontree.Value, s *string) { strs("dns.search", e, s) })
			case is(k, "options"):
				jsontree.List(d, "dns.options", v, &raw.DNS.Options, func(e jsontree.Value, s *string) { strs("dns.options", e, s) })
			}
		})
	case is(k, "cni.dev/valid-attachments"):
		jsontree.List(d, "cni.dev/valid-attachments", v, &raw.ValidAttachments, func(e jsontree.Value, a *types.GCAttachment) {
			d.Object("cni.dev/valid-attachments", e, reflect.TypeFor[types.GCAttachment](), func(k string, v jsontree.Value) {
				switch {
				case is(k, "containerID"):
					d.String("cni.dev/valid-attachments.containerID", v, &a.ContainerID)
				case is(k, "ifname"):
					d.String("cni.dev/valid-attachments.ifname", v, &a.IfName)
				}
			})
		})
	case is(k, "runtimeConfig"):
		raw.RuntimeConfig = v.Raw()
	case is(k, "prevResult"):
		raw.PrevResult = v.Raw()

	// Istio's current format.
	case is(k, "plugin_log_level"):
		str("plugin_log_level", &raw.PluginLogLevel)
	case is(k, "cni_agent_run_dir"):
		str("cni_agent_run_dir", &raw.CNIAgentRunDir)
	case is(k, "exclude_namespaces"):
		jsontree.ListPtr(d, "exclude_namespaces", v, &raw.ExcludeNamespaces, func(e jsontree.Value, s *string) { strs("exclude_namespaces", e, s) })
	case is(k, "pod_namespace"):
		str("pod_namespace", &raw.PodNamespace)
	case is(k, "native_nftables"):
		boolean("native_nftables", &raw.NativeNftables)
	case is(k, "ambient_enabled"):
		boolean("ambient_enabled", &raw.AmbientEnabled)
	case is(k, "enablement_selectors"):
		raw.EnablementSelectors = v.Raw()

	// The legacy format.
	case is(k, "log_level"):
		str("log_level", &raw.LogLevel)
	case is(k, "log_uds_address"):
		str("log_uds_address", &raw.LogUDSAddress)
	case is(k, "hostNSEnterExec"):
		boolean("hostNSEnterExec", &raw.HostNSEnterExec)
	case is(k, "kubernetes"):
		jsontree.ObjectPtr(d, "kubernetes", v, &raw.Kubernetes, func(kb *rawKubernetes, k string, v jsontree.Value) {
			str := func(field string, to **string) { jsontree.Ptr(v, to, func(s *string) { d.String(field, v, s) }) }
			switch {
			case is(k, "kubeconfig"):
				str("kubernetes.kubeconfig", &kb.Kubeconfig)
			case is(k, "k8s_api_root"):
				str("kubernetes.k8s_api_root", &kb.K8sAPIRoot)
			case is(k, "exclude_namespaces"):
				jsontree.ListPtr(d, "kubernetes.exclude_namespaces", v, &kb.ExcludeNamespaces, func(e jsontree.Value, s *string) {
					strs("kubernetes.exclude_namespaces", e, s)
				})
			case is(k, "cni_bin_dir"):
				str("kubernetes.cni_bin_dir", &kb.CNIBinDir)
			case is(k, "intercept_type"):
				str("kubernetes.intercept_type", &kb.InterceptType)
			case is(k, "node_name"):
				str("kubernetes.node_name", &kb.NodeName)
			case is(k, "netns_setup_executable"):
				str("kubernetes.netns_setup_executable", &kb.NetnsSetupExecutable)
			case is(k, "iptables_script"):
				str("kubernetes.iptables_script", &kb.IptablesScript)
			}
		})

	// Ours.
	case is(k, "config_schema"):
		// Set only when it is an integer: decodeConfig reads it after a type
		// error elsewhere, to refuse a newer config by its schema.
		// (Whether it is one is the value's own matter: an earlier type error
		// keeps the decoder from recording this one.)
		if v.Kind == jsontree.Null {
			raw.ConfigSchema = nil
			break
		}
		if n, ok := v.Int64(); v.Kind == jsontree.Number && ok && int64(int(n)) == n {
			schema := int(n)
			raw.ConfigSchema = &schema
			break
		}
		var ignored int
		jsontree.Int(d, "config_schema", v, &ignored) // the type error
	case is(k, "iptables_mode"):
		str("iptables_mode", &raw.IptablesMode)
	case is(k, "pod_lookup"):
		jsontree.ObjectPtr(d, "pod_lookup", v, &raw.PodLookup, func(p *rawPodLookup, k string, v jsontree.Value) {
			switch {
			case is(k, "retries"):
				jsontree.Ptr(v, &p.Retries, func(n *int) { jsontree.Int(d, "pod_lookup.retries", v, n) })
			case is(k, "interval"):
				jsontree.Ptr(v, &p.Interval, func(s *string) { d.String("pod_lookup.interval", v, s) })
			}
		})
	case is(k, "extra_bypass_uids"):
		jsontree.List(d, "extra_bypass_uids", v, &raw.ExtraBypassUIDs, func(e jsontree.Value, u *uint32) { d.Uint32("extra_bypass_uids", e, u) })
	case is(k, "log_socket"):
		str("log_socket", &raw.LogSocket)
	case is(k, "log_file"):
		str("log_file", &raw.LogFile)
	case is(k, "log_as_json"):
		boolean("log_as_json", &raw.LogAsJSON)
	}
}
