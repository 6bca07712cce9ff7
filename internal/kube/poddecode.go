package kube

import (
	"encoding/json"
	"reflect"
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

// decodePod fills p from a pod's JSON as encoding/json.Unmarshal would, without
// its reflection (jsontree.Decoder): the plugin decodes one pod per ADD, and
// encoding/json's first decode in a process costs more than reading the pod. Its
// errors are encoding/json's types: *json.SyntaxError (from encoding/json itself)
// and *json.UnmarshalTypeError naming the field path.
// TestDecodePodAgreesWithEncodingJSON and its fuzz target hold the two to the
// same result.
func decodePod(data []byte, p *Pod) error {
	doc, err := jsontree.Document(data)
	if err != nil {
		return err
	}
	return decodePodDoc(doc, p)
}

// decodePodDoc is decodePod of a parsed document (an agent's pod file, whose
// format version is read from the same tree).
func decodePodDoc(doc jsontree.Value, p *Pod) error {
	d := &jsontree.Decoder{Root: "Pod"}
	d.Object("", doc, reflect.TypeFor[Pod](), func(k string, v jsontree.Value) {
		switch {
		case jsontree.Is(k, "metadata"):
			decodeMeta(d, v, &p.Metadata)
		case jsontree.Is(k, "spec"):
			decodeSpec(d, v, &p.Spec)
		case jsontree.Is(k, "status"):
			decodeStatus(d, v, &p.Status)
		}
	})
	return d.Err()
}

func decodeStrings(d *jsontree.Decoder, field string, v jsontree.Value, to *[]string) {
	jsontree.List(d, field, v, to, func(e jsontree.Value, s *string) { d.String(field, e, s) })
}

func decodeMeta(d *jsontree.Decoder, v jsontree.Value, m *ObjectMeta) {
	strMap := func(field string, v jsontree.Value, to *map[string]string) {
		jsontree.Map(d, field, v, to, func(e jsontree.Value, s *string) { d.String(field, e, s) })
	}
	d.Object("metadata", v, reflect.TypeFor[ObjectMeta](), func(k string, v jsontree.Value) {
		switch {
		case jsontree.Is(k, "name"):
			d.String("metadata.name", v, &m.Name)
		case jsontree.Is(k, "namespace"):
			d.String("metadata.namespace", v, &m.Namespace)
		case jsontree.Is(k, "uid"):
			d.String("metadata.uid", v, &m.UID)
		case jsontree.Is(k, "labels"):
			strMap("metadata.labels", v, &m.Labels)
		case jsontree.Is(k, "annotations"):
			strMap("metadata.annotations", v, &m.Annotations)
		case jsontree.Is(k, "deletionTimestamp"):
			jsontree.Ptr(v, &m.DeletionTimestamp, func(t *time.Time) {
				// time.Time decodes itself, as encoding/json has it do.
				if err := t.UnmarshalJSON(v.Raw()); err != nil {
					d.Stop(err)
				}
			})
		}
	})
}

// decodeRunAs decodes a (pod's or container's) security context's user and group.
func decodeRunAs(d *jsontree.Decoder, field, k string, v jsontree.Value, user, group **int64) {
	switch {
	case jsontree.Is(k, "runAsUser"):
		jsontree.Ptr(v, user, func(n *int64) { jsontree.Int(d, field+".runAsUser", v, n) })
	case jsontree.Is(k, "runAsGroup"):
		jsontree.Ptr(v, group, func(n *int64) { jsontree.Int(d, field+".runAsGroup", v, n) })
	}
}

func decodeSpec(d *jsontree.Decoder, v jsontree.Value, s *PodSpec) {
	d.Object("spec", v, reflect.TypeFor[PodSpec](), func(k string, v jsontree.Value) {
		switch {
		case jsontree.Is(k, "nodeName"):
			d.String("spec.nodeName", v, &s.NodeName)
		case jsontree.Is(k, "initContainers"):
			jsontree.List(d, "spec.initContainers", v, &s.InitContainers, func(e jsontree.Value, c *Container) {
				decodeContainer(d, "spec.initContainers", e, c)
			})
		case jsontree.Is(k, "containers"):
			jsontree.List(d, "spec.containers", v, &s.Containers, func(e jsontree.Value, c *Container) {
				decodeContainer(d, "spec.containers", e, c)
			})
		case jsontree.Is(k, "securityContext"):
			jsontree.ObjectPtr(d, "spec.securityContext", v, &s.SecurityContext, func(sc *PodSecurityContext, k string, v jsontree.Value) {
				decodeRunAs(d, "spec.securityContext", k, v, &sc.RunAsUser, &sc.RunAsGroup)
			})
		}
	})
}

func decodeContainer(d *jsontree.Decoder, field string, v jsontree.Value, c *Container) {
	d.Object(field, v, reflect.TypeFor[Container](), func(k string, v jsontree.Value) {
		switch {
		case jsontree.Is(k, "name"):
			d.String(field+".name", v, &c.Name)
		case jsontree.Is(k, "image"):
			d.String(field+".image", v, &c.Image)
		case jsontree.Is(k, "args"):
			decodeStrings(d, field+".args", v, &c.Args)
		case jsontree.Is(k, "env"):
			jsontree.List(d, field+".env", v, &c.Env, func(e jsontree.Value, ev *EnvVar) {
				d.Object(field+".env", e, reflect.TypeFor[EnvVar](), func(k string, v jsontree.Value) {
					switch {
					case jsontree.Is(k, "name"):
						d.String(field+".env.name", v, &ev.Name)
					case jsontree.Is(k, "value"):
						d.String(field+".env.value", v, &ev.Value)
					}
				})
			})
		case jsontree.Is(k, "ports"):
			jsontree.List(d, field+".ports", v, &c.Ports, func(e jsontree.Value, p *ContainerPort) {
				d.Object(field+".ports", e, reflect.TypeFor[ContainerPort](), func(k string, v jsontree.Value) {
					switch {
					case jsontree.Is(k, "name"):
						d.String(field+".ports.name", v, &p.Name)
					case jsontree.Is(k, "containerPort"):
						jsontree.Int(d, field+".ports.containerPort", v, &p.ContainerPort)
					case jsontree.Is(k, "protocol"):
						d.String(field+".ports.protocol", v, &p.Protocol)
					}
				})
			})
		case jsontree.Is(k, "securityContext"):
			jsontree.ObjectPtr(d, field+".securityContext", v, &c.SecurityContext, func(sc *SecurityContext, k string, v jsontree.Value) {
				decodeRunAs(d, field+".securityContext", k, v, &sc.RunAsUser, &sc.RunAsGroup)
			})
		case jsontree.Is(k, "restartPolicy"):
			d.String(field+".restartPolicy", v, &c.RestartPolicy)
		}
	})
}

func decodeStatus(d *jsontree.Decoder, v jsontree.Value, s *PodStatus) {
	d.Object("status", v, reflect.TypeFor[PodStatus](), func(k string, v jsontree.Value) {
		switch {
		case jsontree.Is(k, "phase"):
			d.String("status.phase", v, &s.Phase)
		case jsontree.Is(k, "podIP"):
			d.String("status.podIP", v, &s.PodIP)
		case jsontree.Is(k, "podIPs"):
			jsontree.List(d, "status.podIPs", v, &s.PodIPs, func(e jsontree.Value, ip *PodIP) {
				d.Object("status.podIPs", e, reflect.TypeFor[PodIP](), func(k string, v jsontree.Value) {
					if jsontree.Is(k, "ip") {
						d.String("status.podIPs.ip", v, &ip.IP)
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
	doc, err := jsontree.Document(data)
	if err != nil {
		return err
	}
	d := &jsontree.Decoder{Root: "kubeconfigFile"}
	// fields decodes an object whose members are the strings strs names, and
	// gives any other member to other.
	fields := func(field string, v jsontree.Value, t reflect.Type, strs map[string]*string, other func(k string, v jsontree.Value)) {
		d.Object(field, v, t, func(k string, v jsontree.Value) {
			for name, s := range strs {
				if jsontree.Is(k, name) {
					d.String(field+"."+name, v, s)
					return
				}
			}
			if other != nil {
				other(k, v)
			}
		})
	}
	d.Object("", doc, reflect.TypeFor[kubeconfigFile](), func(k string, v jsontree.Value) {
		switch {
		case jsontree.Is(k, "current-context"):
			d.String("current-context", v, &f.CurrentContext)
		case jsontree.Is(k, "clusters"):
			jsontree.List(d, "clusters", v, &f.Clusters, func(e jsontree.Value, c *kubeconfigCluster) {
				cl := &c.Cluster
				fields("clusters", e, reflect.TypeFor[kubeconfigCluster](), map[string]*string{"name": &c.Name}, func(k string, v jsontree.Value) {
					if !jsontree.Is(k, "cluster") {
						return
					}
					fields("clusters.cluster", v, reflect.TypeOf(c.Cluster), map[string]*string{
						"server": &cl.Server, "certificate-authority": &cl.CertificateAuthority,
						"certificate-authority-data": &cl.CertificateAuthorityData,
						"tls-server-name":            &cl.TLSServerName,
						"proxy-url":                  &cl.ProxyURL,
					}, func(k string, v jsontree.Value) {
						if jsontree.Is(k, "insecure-skip-tls-verify") {
							d.Bool("clusters.cluster.insecure-skip-tls-verify", v, &cl.InsecureSkipTLSVerify)
						}
					})
				})
			})
		case jsontree.Is(k, "contexts"):
			jsontree.List(d, "contexts", v, &f.Contexts, func(e jsontree.Value, c *kubeconfigContext) {
				fields("contexts", e, reflect.TypeFor[kubeconfigContext](), map[string]*string{"name": &c.Name}, func(k string, v jsontree.Value) {
					if jsontree.Is(k, "context") {
						fields("contexts.context", v, reflect.TypeOf(c.Context), map[string]*string{
							"cluster": &c.Context.Cluster, "user": &c.Context.User,
						}, nil)
					}
				})
			})
		case jsontree.Is(k, "users"):
			jsontree.List(d, "users", v, &f.Users, func(e jsontree.Value, u *kubeconfigUser) {
				us := &u.User
				fields("users", e, reflect.TypeFor[kubeconfigUser](), map[string]*string{"name": &u.Name}, func(k string, v jsontree.Value) {
					if jsontree.Is(k, "user") {
						fields("users.user", v, reflect.TypeOf(u.User), map[string]*string{
							"token": &us.Token, "tokenFile": &us.TokenFile,
							"client-certificate": &us.ClientCertificate, "client-certificate-data": &us.ClientCertificateData,
							"client-key": &us.ClientKey, "client-key-data": &us.ClientKeyData,
							"username": &us.Username, "password": &us.Password, "as": &us.As, "as-uid": &us.AsUID,
						}, func(k string, v jsontree.Value) {
							for name, to := range map[string]*json.RawMessage{
								"exec": &us.Exec, "auth-provider": &us.AuthProvider,
								"as-groups": &us.AsGroups, "as-user-extra": &us.AsUserExtra,
							} {
								if jsontree.Is(k, name) {
									// As json.RawMessage's UnmarshalJSON: the value's bytes, null included.
									*to = append((*to)[:0], v.Raw()...)
									return
								}
							}
						})
					}
				})
			})
		}
	})
	return d.Err()
}
