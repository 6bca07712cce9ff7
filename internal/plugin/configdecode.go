package plugin

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"

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
	doc, err := jsontree.Parse(data)
	if err != nil {
		// Refused: encoding/json says why in its words (the error path is not
		// the hot one).
		var v any
		if stdErr := json.Unmarshal(data, &v); stdErr != nil {
			return stdErr
		}
		return err
	}
	d := &decoder{}
	switch doc.Kind {
	case jsontree.Null:
		return nil
	case jsontree.Object:
	default:
		return &json.UnmarshalTypeError{Value: doc.Kind.String(), Type: reflect.TypeFor[rawConfig]()}
	}
	for _, m := range doc.Members() {
		d.member(raw, m)
	}
	return d.err
}

// decoder keeps the first type error, as encoding/json does, and goes on.
type decoder struct{ err error }

// typeErr records that field's value v is not of type want (named as
// encoding/json names it: a number's literal when an integer cannot hold it).
func (d *decoder) typeErr(field string, v jsontree.Value, want reflect.Type) {
	if d.err != nil {
		return
	}
	got := v.Kind.String()
	switch want.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if v.Kind == jsontree.Number {
			got = "number " + string(v.Raw())
		}
	}
	d.err = &json.UnmarshalTypeError{Value: got, Type: want, Field: field}
}

// match says whether the JSON key names the field: exactly, or as encoding/json
// folds it.
func match(key, field string) bool { return key == field || strings.EqualFold(key, field) }

func (d *decoder) member(raw *rawConfig, m jsontree.Member) {
	k, v := m.Key, m.Value
	switch {
	// types.NetConf's (the embedded struct's keys lose to ours: prevResult).
	case match(k, "cniVersion"):
		d.str("cniVersion", v, &raw.CNIVersion)
	case match(k, "name"):
		d.str("name", v, &raw.Name)
	case match(k, "type"):
		d.str("type", v, &raw.Type)
	case match(k, "capabilities"):
		d.capabilities("capabilities", v, &raw.Capabilities)
	case match(k, "ipam"):
		d.object("ipam", v, func(m jsontree.Member) {
			if match(m.Key, "type") {
				d.str("ipam.type", m.Value, &raw.IPAM.Type)
			}
		})
	case match(k, "dns"):
		d.object("dns", v, func(m jsontree.Member) {
			switch {
			case match(m.Key, "nameservers"):
				d.strings("dns.nameservers", m.Value, &raw.DNS.Nameservers)
			case match(m.Key, "domain"):
				d.str("dns.domain", m.Value, &raw.DNS.Domain)
			case match(m.Key, "search"):
				d.strings("dns.search", m.Value, &raw.DNS.Search)
			case match(m.Key, "options"):
				d.strings("dns.options", m.Value, &raw.DNS.Options)
			}
		})
	case match(k, "cni.dev/valid-attachments"):
		d.attachments("cni.dev/valid-attachments", v, &raw.ValidAttachments)
	case match(k, "runtimeConfig"):
		raw.RuntimeConfig = v.Raw()
	case match(k, "prevResult"):
		raw.PrevResult = v.Raw()

	// Istio's current format.
	case match(k, "plugin_log_level"):
		d.strPtr("plugin_log_level", v, &raw.PluginLogLevel)
	case match(k, "cni_agent_run_dir"):
		d.strPtr("cni_agent_run_dir", v, &raw.CNIAgentRunDir)
	case match(k, "exclude_namespaces"):
		d.stringsPtr("exclude_namespaces", v, &raw.ExcludeNamespaces)
	case match(k, "pod_namespace"):
		d.strPtr("pod_namespace", v, &raw.PodNamespace)
	case match(k, "native_nftables"):
		d.boolPtr("native_nftables", v, &raw.NativeNftables)
	case match(k, "ambient_enabled"):
		d.boolPtr("ambient_enabled", v, &raw.AmbientEnabled)
	case match(k, "enablement_selectors"):
		raw.EnablementSelectors = v.Raw()

	// The legacy format.
	case match(k, "log_level"):
		d.strPtr("log_level", v, &raw.LogLevel)
	case match(k, "log_uds_address"):
		d.strPtr("log_uds_address", v, &raw.LogUDSAddress)
	case match(k, "hostNSEnterExec"):
		d.boolPtr("hostNSEnterExec", v, &raw.HostNSEnterExec)
	case match(k, "kubernetes"):
		d.kubernetes("kubernetes", v, &raw.Kubernetes)

	// Ours.
	case match(k, "config_schema"):
		d.intPtr("config_schema", v, &raw.ConfigSchema)
	case match(k, "iptables_mode"):
		d.strPtr("iptables_mode", v, &raw.IptablesMode)
	case match(k, "pod_lookup"):
		d.podLookup("pod_lookup", v, &raw.PodLookup)
	case match(k, "extra_bypass_uids"):
		d.uids("extra_bypass_uids", v, &raw.ExtraBypassUIDs)
	case match(k, "log_socket"):
		d.strPtr("log_socket", v, &raw.LogSocket)
	case match(k, "log_file"):
		d.strPtr("log_file", v, &raw.LogFile)
	case match(k, "log_as_json"):
		d.boolPtr("log_as_json", v, &raw.LogAsJSON)
	}
}

// Setters: each takes the field's path for a type error, the value, and where
// to store it, as encoding/json stores into that Go type.

func (d *decoder) str(field string, v jsontree.Value, to *string) {
	switch v.Kind {
	case jsontree.Null:
	case jsontree.String:
		*to = v.Str()
	default:
		d.typeErr(field, v, reflect.TypeFor[string]())
	}
}

func (d *decoder) strPtr(field string, v jsontree.Value, to **string) {
	switch v.Kind {
	case jsontree.Null:
		*to = nil
	case jsontree.String:
		s := v.Str()
		*to = &s
	default:
		d.typeErr(field, v, reflect.TypeFor[string]())
	}
}

func (d *decoder) boolPtr(field string, v jsontree.Value, to **bool) {
	switch v.Kind {
	case jsontree.Null:
		*to = nil
	case jsontree.Bool:
		b := v.BoolValue()
		*to = &b
	default:
		d.typeErr(field, v, reflect.TypeFor[bool]())
	}
}

func (d *decoder) intPtr(field string, v jsontree.Value, to **int) {
	switch v.Kind {
	case jsontree.Null:
		*to = nil
	case jsontree.Number:
		n, ok := v.Int64()
		if !ok || n < math.MinInt || n > math.MaxInt {
			d.typeErr(field, v, reflect.TypeFor[int]())
			return
		}
		i := int(n)
		*to = &i
	default:
		d.typeErr(field, v, reflect.TypeFor[int]())
	}
}

// strings decodes a list of strings into to (a null list is nil; a null
// element is "").
func (d *decoder) strings(field string, v jsontree.Value, to *[]string) {
	switch v.Kind {
	case jsontree.Null:
		*to = nil
	case jsontree.Array:
		out := make([]string, len(v.Elems()))
		for i, e := range v.Elems() {
			d.str(field, e, &out[i])
		}
		*to = out
	default:
		d.typeErr(field, v, reflect.TypeFor[[]string]())
	}
}

func (d *decoder) stringsPtr(field string, v jsontree.Value, to **[]string) {
	if v.Kind == jsontree.Null {
		*to = nil
		return
	}
	if v.Kind != jsontree.Array {
		d.typeErr(field, v, reflect.TypeFor[[]string]())
		return
	}
	list := new([]string)
	d.strings(field, v, list)
	*to = list
}

func (d *decoder) uids(field string, v jsontree.Value, to *[]uint32) {
	switch v.Kind {
	case jsontree.Null:
		*to = nil
	case jsontree.Array:
		out := make([]uint32, len(v.Elems()))
		for i, e := range v.Elems() {
			switch e.Kind {
			case jsontree.Null:
			case jsontree.Number:
				n, ok := e.Uint64()
				if !ok || n > math.MaxUint32 {
					d.typeErr(field, e, reflect.TypeFor[uint32]())
					continue
				}
				out[i] = uint32(n)
			default:
				d.typeErr(field, e, reflect.TypeFor[uint32]())
			}
		}
		*to = out
	default:
		d.typeErr(field, v, reflect.TypeFor[[]uint32]())
	}
}

// object calls each for every member of an object (null: none).
func (d *decoder) object(field string, v jsontree.Value, each func(jsontree.Member)) bool {
	switch v.Kind {
	case jsontree.Null:
		return false
	case jsontree.Object:
		for _, m := range v.Members() {
			each(m)
		}
		return true
	}
	d.typeErr(field, v, reflect.TypeFor[struct{}]())
	return false
}

func (d *decoder) capabilities(field string, v jsontree.Value, to *map[string]bool) {
	switch v.Kind {
	case jsontree.Null:
		*to = nil
	case jsontree.Object:
		if *to == nil {
			*to = map[string]bool{}
		}
		for _, m := range v.Members() {
			switch m.Value.Kind {
			case jsontree.Null:
				(*to)[m.Key] = false
			case jsontree.Bool:
				(*to)[m.Key] = m.Value.BoolValue()
			default:
				d.typeErr(field, m.Value, reflect.TypeFor[bool]())
			}
		}
	default:
		d.typeErr(field, v, reflect.TypeFor[map[string]bool]())
	}
}

func (d *decoder) attachments(field string, v jsontree.Value, to *[]types.GCAttachment) {
	switch v.Kind {
	case jsontree.Null:
		*to = nil
	case jsontree.Array:
		out := make([]types.GCAttachment, len(v.Elems()))
		for i, e := range v.Elems() {
			d.object(field, e, func(m jsontree.Member) {
				switch {
				case match(m.Key, "containerID"):
					d.str(field+".containerID", m.Value, &out[i].ContainerID)
				case match(m.Key, "ifname"):
					d.str(field+".ifname", m.Value, &out[i].IfName)
				}
			})
		}
		*to = out
	default:
		d.typeErr(field, v, reflect.TypeFor[[]types.GCAttachment]())
	}
}

// kubernetes decodes the legacy block into *to, merging into a block an earlier
// duplicate key made (null clears it).
func (d *decoder) kubernetes(field string, v jsontree.Value, to **rawKubernetes) {
	if v.Kind == jsontree.Null {
		*to = nil
		return
	}
	if v.Kind != jsontree.Object {
		d.typeErr(field, v, reflect.TypeFor[rawKubernetes]())
		return
	}
	if *to == nil {
		*to = &rawKubernetes{}
	}
	k := *to
	for _, m := range v.Members() {
		switch mv := m.Value; {
		case match(m.Key, "kubeconfig"):
			d.strPtr("kubernetes.kubeconfig", mv, &k.Kubeconfig)
		case match(m.Key, "k8s_api_root"):
			d.strPtr("kubernetes.k8s_api_root", mv, &k.K8sAPIRoot)
		case match(m.Key, "exclude_namespaces"):
			d.stringsPtr("kubernetes.exclude_namespaces", mv, &k.ExcludeNamespaces)
		case match(m.Key, "cni_bin_dir"):
			d.strPtr("kubernetes.cni_bin_dir", mv, &k.CNIBinDir)
		case match(m.Key, "intercept_type"):
			d.strPtr("kubernetes.intercept_type", mv, &k.InterceptType)
		case match(m.Key, "node_name"):
			d.strPtr("kubernetes.node_name", mv, &k.NodeName)
		case match(m.Key, "netns_setup_executable"):
			d.strPtr("kubernetes.netns_setup_executable", mv, &k.NetnsSetupExecutable)
		case match(m.Key, "iptables_script"):
			d.strPtr("kubernetes.iptables_script", mv, &k.IptablesScript)
		}
	}
}

func (d *decoder) podLookup(field string, v jsontree.Value, to **rawPodLookup) {
	if v.Kind == jsontree.Null {
		*to = nil
		return
	}
	if v.Kind != jsontree.Object {
		d.typeErr(field, v, reflect.TypeFor[rawPodLookup]())
		return
	}
	if *to == nil {
		*to = &rawPodLookup{}
	}
	p := *to
	for _, m := range v.Members() {
		switch {
		case match(m.Key, "retries"):
			d.intPtr("pod_lookup.retries", m.Value, &p.Retries)
		case match(m.Key, "interval"):
			d.strPtr("pod_lookup.interval", m.Value, &p.Interval)
		}
	}
}
