package kube

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"time"

	"github.com/istio-cni/istio-cni/internal/jsontree"
)

// decodeJSON decodes data into out; a *Pod without reflection (decodePod), the
// rest with encoding/json.
func decodeJSON(data []byte, out any) error {
	if p, ok := out.(*Pod); ok {
		return decodePod(data, p)
	}
	return json.Unmarshal(data, out)
}

// decodePod fills p from a pod's JSON as encoding/json.Unmarshal would (keys
// matched exactly, then case-insensitively; a later duplicate wins and a repeated
// object merges into the earlier; null leaves a value, clears a pointer, map or
// list), without its reflection: the plugin decodes one pod per ADD, and
// encoding/json's first decode in a process costs more than reading the pod
// (package jsontree). Its errors are encoding/json's types: *json.SyntaxError
// (from encoding/json itself, in its words) and *json.UnmarshalTypeError naming
// the field path, the first in the document. TestDecodePodAgreesWithEncodingJSON
// and its fuzz target hold the two to the same result.
func decodePod(data []byte, p *Pod) error {
	doc, err := jsontree.Parse(data)
	if err != nil {
		var v any
		if stdErr := json.Unmarshal(data, &v); stdErr != nil {
			return stdErr
		}
		return err
	}
	d := &podDecoder{root: "Pod"}
	d.object("", doc, reflect.TypeFor[Pod](), func(k string, v jsontree.Value) {
		switch {
		case is(k, "metadata"):
			d.meta(v, &p.Metadata)
		case is(k, "spec"):
			d.spec(v, &p.Spec)
		case is(k, "status"):
			d.status(v, &p.Status)
		}
	})
	return d.err
}

// is says whether the JSON key k names the field: exactly, or as encoding/json
// folds it.
func is(k, field string) bool { return k == field || strings.EqualFold(k, field) }

// podDecoder (of pods and kubeconfigs) keeps the first type error, as encoding/json does, and goes on; an
// error of a value that decodes itself (time.Time) stops it and is the error, as
// in encoding/json.
type podDecoder struct {
	root    string // the decoded type's name, for the errors' Struct
	err     error
	stopped bool
}

func (d *podDecoder) typeErr(field string, v jsontree.Value, want reflect.Type) {
	if d.err != nil {
		return
	}
	got := v.Kind.String()
	if v.Kind == jsontree.Number && (want.Kind() == reflect.Int64 || want.Kind() == reflect.Int32) {
		got = "number " + string(v.Raw())
	}
	d.err = &json.UnmarshalTypeError{Value: got, Type: want, Struct: d.root, Field: field}
}

// object calls each for the members of an object; null is nothing, another kind
// a type error (t: the Go type it decodes into).
func (d *podDecoder) object(field string, v jsontree.Value, t reflect.Type, each func(k string, v jsontree.Value)) {
	switch v.Kind {
	case jsontree.Null:
	case jsontree.Object:
		for _, m := range v.Members() {
			if d.stopped {
				return
			}
			each(m.Key, m.Value)
		}
	default:
		d.typeErr(field, v, t)
	}
}

func (d *podDecoder) boolean(field string, v jsontree.Value, to *bool) {
	switch v.Kind {
	case jsontree.Null:
	case jsontree.Bool:
		*to = v.BoolValue()
	default:
		d.typeErr(field, v, reflect.TypeFor[bool]())
	}
}

func (d *podDecoder) str(field string, v jsontree.Value, to *string) {
	switch v.Kind {
	case jsontree.Null:
	case jsontree.String:
		*to = v.Str()
	default:
		d.typeErr(field, v, reflect.TypeFor[string]())
	}
}

func (d *podDecoder) int32(field string, v jsontree.Value, to *int32) {
	switch v.Kind {
	case jsontree.Null:
	case jsontree.Number:
		n, ok := v.Int64()
		if !ok || n < math.MinInt32 || n > math.MaxInt32 {
			d.typeErr(field, v, reflect.TypeFor[int32]())
			return
		}
		*to = int32(n)
	default:
		d.typeErr(field, v, reflect.TypeFor[int32]())
	}
}

func (d *podDecoder) int64Ptr(field string, v jsontree.Value, to **int64) {
	switch v.Kind {
	case jsontree.Null:
		*to = nil
	case jsontree.Number:
		n, ok := v.Int64()
		if !ok {
			d.typeErr(field, v, reflect.TypeFor[int64]())
			return
		}
		*to = &n
	default:
		d.typeErr(field, v, reflect.TypeFor[int64]())
	}
}

// strMap decodes an object of strings into *to, adding to a map an earlier
// duplicate key made.
func (d *podDecoder) strMap(field string, v jsontree.Value, to *map[string]string) {
	switch v.Kind {
	case jsontree.Null:
		*to = nil
	case jsontree.Object:
		if *to == nil {
			*to = make(map[string]string, len(v.Members()))
		}
		for _, m := range v.Members() {
			var s string
			d.str(field, m.Value, &s)
			(*to)[m.Key] = s
		}
	default:
		d.typeErr(field, v, reflect.TypeFor[map[string]string]())
	}
}

// list decodes an array into *to as encoding/json decodes into a slice: into the
// elements it already has (a repeated key's second list overwrites the first's
// elements field by field), growing it as append does, an empty list being a new
// empty slice; null is a nil list, another kind a type error.
func list[T any](d *podDecoder, field string, v jsontree.Value, to *[]T, each func(e jsontree.Value, into *T)) {
	switch v.Kind {
	case jsontree.Null:
		*to = nil
	case jsontree.Array:
		out := *to
		var zero T
		for i, e := range v.Elems() {
			if d.stopped {
				return
			}
			if i >= cap(out) {
				out = append(out[:cap(out)], zero)
			}
			if i >= len(out) {
				out = out[:i+1]
			}
			each(e, &out[i])
		}
		out = out[:len(v.Elems())]
		if len(out) == 0 {
			out = make([]T, 0)
		}
		*to = out
	default:
		d.typeErr(field, v, reflect.TypeFor[[]T]())
	}
}

func (d *podDecoder) meta(v jsontree.Value, m *ObjectMeta) {
	d.object("metadata", v, reflect.TypeFor[ObjectMeta](), func(k string, v jsontree.Value) {
		switch {
		case is(k, "name"):
			d.str("metadata.name", v, &m.Name)
		case is(k, "namespace"):
			d.str("metadata.namespace", v, &m.Namespace)
		case is(k, "uid"):
			d.str("metadata.uid", v, &m.UID)
		case is(k, "labels"):
			d.strMap("metadata.labels", v, &m.Labels)
		case is(k, "annotations"):
			d.strMap("metadata.annotations", v, &m.Annotations)
		case is(k, "deletionTimestamp"):
			if v.Kind == jsontree.Null {
				m.DeletionTimestamp = nil
				return
			}
			if m.DeletionTimestamp == nil {
				m.DeletionTimestamp = new(time.Time)
			}
			// time.Time decodes itself, as encoding/json has it do.
			if err := m.DeletionTimestamp.UnmarshalJSON(v.Raw()); err != nil {
				d.err, d.stopped = err, true
			}
		}
	})
}

func (d *podDecoder) spec(v jsontree.Value, s *PodSpec) {
	d.object("spec", v, reflect.TypeFor[PodSpec](), func(k string, v jsontree.Value) {
		switch {
		case is(k, "nodeName"):
			d.str("spec.nodeName", v, &s.NodeName)
		case is(k, "initContainers"):
			list(d, "spec.initContainers", v, &s.InitContainers, func(e jsontree.Value, c *Container) { d.container("spec.initContainers", e, c) })
		case is(k, "containers"):
			list(d, "spec.containers", v, &s.Containers, func(e jsontree.Value, c *Container) { d.container("spec.containers", e, c) })
		case is(k, "securityContext"):
			if v.Kind == jsontree.Null {
				s.SecurityContext = nil
				return
			}
			if v.Kind != jsontree.Object {
				d.typeErr("spec.securityContext", v, reflect.TypeFor[PodSecurityContext]())
				return
			}
			if s.SecurityContext == nil {
				s.SecurityContext = &PodSecurityContext{}
			}
			d.runAs("spec.securityContext", v, &s.SecurityContext.RunAsUser, &s.SecurityContext.RunAsGroup)
		}
	})
}

func (d *podDecoder) runAs(field string, v jsontree.Value, user, group **int64) {
	for _, m := range v.Members() {
		switch {
		case is(m.Key, "runAsUser"):
			d.int64Ptr(field+".runAsUser", m.Value, user)
		case is(m.Key, "runAsGroup"):
			d.int64Ptr(field+".runAsGroup", m.Value, group)
		}
	}
}

func (d *podDecoder) container(field string, v jsontree.Value, c *Container) {
	d.object(field, v, reflect.TypeFor[Container](), func(k string, v jsontree.Value) {
		switch {
		case is(k, "name"):
			d.str(field+".name", v, &c.Name)
		case is(k, "image"):
			d.str(field+".image", v, &c.Image)
		case is(k, "args"):
			list(d, field+".args", v, &c.Args, func(e jsontree.Value, s *string) { d.str(field+".args", e, s) })
		case is(k, "env"):
			list(d, field+".env", v, &c.Env, func(e jsontree.Value, ev *EnvVar) {
				d.object(field+".env", e, reflect.TypeFor[EnvVar](), func(k string, v jsontree.Value) {
					switch {
					case is(k, "name"):
						d.str(field+".env.name", v, &ev.Name)
					case is(k, "value"):
						d.str(field+".env.value", v, &ev.Value)
					}
				})
			})
		case is(k, "ports"):
			list(d, field+".ports", v, &c.Ports, func(e jsontree.Value, p *ContainerPort) {
				d.object(field+".ports", e, reflect.TypeFor[ContainerPort](), func(k string, v jsontree.Value) {
					switch {
					case is(k, "name"):
						d.str(field+".ports.name", v, &p.Name)
					case is(k, "containerPort"):
						d.int32(field+".ports.containerPort", v, &p.ContainerPort)
					case is(k, "protocol"):
						d.str(field+".ports.protocol", v, &p.Protocol)
					}
				})
			})
		case is(k, "securityContext"):
			if v.Kind == jsontree.Null {
				c.SecurityContext = nil
				return
			}
			if v.Kind != jsontree.Object {
				d.typeErr(field+".securityContext", v, reflect.TypeFor[SecurityContext]())
				return
			}
			if c.SecurityContext == nil {
				c.SecurityContext = &SecurityContext{}
			}
			d.runAs(field+".securityContext", v, &c.SecurityContext.RunAsUser, &c.SecurityContext.RunAsGroup)
		case is(k, "restartPolicy"):
			d.str(field+".restartPolicy", v, &c.RestartPolicy)
		}
	})
}

func (d *podDecoder) status(v jsontree.Value, s *PodStatus) {
	d.object("status", v, reflect.TypeFor[PodStatus](), func(k string, v jsontree.Value) {
		switch {
		case is(k, "phase"):
			d.str("status.phase", v, &s.Phase)
		case is(k, "podIP"):
			d.str("status.podIP", v, &s.PodIP)
		case is(k, "podIPs"):
			list(d, "status.podIPs", v, &s.PodIPs, func(e jsontree.Value, ip *PodIP) {
				d.object("status.podIPs", e, reflect.TypeFor[PodIP](), func(k string, v jsontree.Value) {
					if is(k, "ip") {
						d.str("status.podIPs.ip", v, &ip.IP)
					}
				})
			})
		}
	})
}

// decodeKubeconfig fills f from a kubeconfig's JSON (yamlToJSON's) as
// encoding/json.Unmarshal would, without its reflection (see decodePod);
// TestDecodeKubeconfigAgreesWithEncodingJSON holds the two to the same result.
func decodeKubeconfig(data []byte, f *kubeconfigFile) error {
	doc, err := jsontree.Parse(data)
	if err != nil {
		var v any
		if stdErr := json.Unmarshal(data, &v); stdErr != nil {
			return stdErr
		}
		return err
	}
	d := &podDecoder{root: "kubeconfigFile"}
	d.object("", doc, reflect.TypeFor[kubeconfigFile](), func(k string, v jsontree.Value) {
		switch {
		case is(k, "current-context"):
			d.str("current-context", v, &f.CurrentContext)
		case is(k, "clusters"):
			list(d, "clusters", v, &f.Clusters, func(e jsontree.Value, c *kubeconfigCluster) {
				d.object("clusters", e, reflect.TypeFor[kubeconfigCluster](), func(k string, v jsontree.Value) {
					switch {
					case is(k, "name"):
						d.str("clusters.name", v, &c.Name)
					case is(k, "cluster"):
						cl := &c.Cluster
						d.object("clusters.cluster", v, reflect.TypeOf(c.Cluster), func(k string, v jsontree.Value) {
							switch {
							case is(k, "server"):
								d.str("clusters.cluster.server", v, &cl.Server)
							case is(k, "certificate-authority"):
								d.str("clusters.cluster.certificate-authority", v, &cl.CertificateAuthority)
							case is(k, "certificate-authority-data"):
								d.str("clusters.cluster.certificate-authority-data", v, &cl.CertificateAuthorityData)
							case is(k, "insecure-skip-tls-verify"):
								d.boolean("clusters.cluster.insecure-skip-tls-verify", v, &cl.InsecureSkipTLSVerify)
							}
						})
					}
				})
			})
		case is(k, "contexts"):
			list(d, "contexts", v, &f.Contexts, func(e jsontree.Value, c *kubeconfigContext) {
				d.object("contexts", e, reflect.TypeFor[kubeconfigContext](), func(k string, v jsontree.Value) {
					switch {
					case is(k, "name"):
						d.str("contexts.name", v, &c.Name)
					case is(k, "context"):
						d.object("contexts.context", v, reflect.TypeOf(c.Context), func(k string, v jsontree.Value) {
							switch {
							case is(k, "cluster"):
								d.str("contexts.context.cluster", v, &c.Context.Cluster)
							case is(k, "user"):
								d.str("contexts.context.user", v, &c.Context.User)
							}
						})
					}
				})
			})
		case is(k, "users"):
			list(d, "users", v, &f.Users, func(e jsontree.Value, u *kubeconfigUser) {
				d.object("users", e, reflect.TypeFor[kubeconfigUser](), func(k string, v jsontree.Value) {
					switch {
					case is(k, "name"):
						d.str("users.name", v, &u.Name)
					case is(k, "user"):
						us := &u.User
						d.object("users.user", v, reflect.TypeOf(u.User), func(k string, v jsontree.Value) {
							switch {
							case is(k, "token"):
								d.str("users.user.token", v, &us.Token)
							case is(k, "tokenFile"):
								d.str("users.user.tokenFile", v, &us.TokenFile)
							case is(k, "client-certificate"):
								d.str("users.user.client-certificate", v, &us.ClientCertificate)
							case is(k, "client-certificate-data"):
								d.str("users.user.client-certificate-data", v, &us.ClientCertificateData)
							case is(k, "client-key"):
								d.str("users.user.client-key", v, &us.ClientKey)
							case is(k, "client-key-data"):
								d.str("users.user.client-key-data", v, &us.ClientKeyData)
							}
						})
					}
				})
			})
		}
	})
	return d.err
}
