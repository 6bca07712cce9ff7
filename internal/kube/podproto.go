package kube

import (
	"bytes"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// The API server's protobuf form of built-in objects (Kubernetes' own
// "application/vnd.kubernetes.protobuf"), which the plugin asks for a pod in: the
// API server encodes it with less work than JSON, and the plugin reads the fields
// it needs straight off the wire, skipping the rest (managed fields, volumes,
// status conditions) without building anything for them. A body is told from JSON
// by its first four bytes (ProtobufMagic), as the API machinery's own decoder
// tells it; JSON never starts with them.
//
// The field numbers are core/v1's and meta/v1's (k8s.io/api's generated.proto),
// which never change: protobuf field numbers are part of Kubernetes' API
// compatibility. TestProtobufPodDecodesAsItsJSON holds the decoder to the JSON
// decoder's result on pods encoded by k8s.io/api, and the end-to-end lookups read
// real pods in protobuf from a real API server.

// ProtobufContentType is the media type of Kubernetes' protobuf encoding.
const ProtobufContentType = "application/vnd.kubernetes.protobuf"

// ProtobufMagic starts every protobuf body the API server sends: an envelope
// (runtime.Unknown) whose raw bytes are the object.
var ProtobufMagic = []byte("k8s\x00")

// isProtobuf says whether an answer's body is in Kubernetes' protobuf encoding.
func isProtobuf(data []byte) bool { return bytes.HasPrefix(data, ProtobufMagic) }

// Protobuf wire types (protobuf's encoding specification).
const (
	wireVarint  = 0
	wireFixed64 = 1
	wireBytes   = 2
	wireFixed32 = 5
)

// maxFieldNumber is protobuf's highest field number.
const maxFieldNumber = 1<<29 - 1

var errTruncated = errors.New("truncated")

// pbField is one field of a protobuf message as read off the wire: its number,
// wire type, and its value (v for a varint, data for a length-delimited one).
type pbField struct {
	num  uint64
	wire uint64
	v    uint64
	data []byte
}

// uvarint reads a base-128 varint at the start of b: its value and length, or a
// length of 0 when b ends inside it or it is longer than 10 bytes.
func uvarint(b []byte) (uint64, int) {
	var x uint64
	for i := 0; i < len(b) && i < 10; i++ {
		c := b[i]
		if i == 9 && c > 1 {
			return 0, 0 // beyond 64 bits
		}
		x |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			return x, i + 1
		}
	}
	return 0, 0
}

// pbEach calls fn with each field of the message in b, in wire order, skipping
// fixed-width fields (none of the fields read here has one). field names the
// message in errors. Groups (wire types 3 and 4, deprecated, never in Kubernetes'
// objects) are an error, as is any truncation.
func pbEach(field string, b []byte, fn func(f pbField) error) error {
	for len(b) > 0 {
		tag, n := uvarint(b)
		if n == 0 {
			return fmt.Errorf("%s: field tag: %w", field, errTruncated)
		}
		b = b[n:]
		f := pbField{num: tag >> 3, wire: tag & 7}
		if f.num == 0 {
			return fmt.Errorf("%s: field number 0", field)
		}
		if f.num > maxFieldNumber {
			// The API machinery would read it as its low 32 bits: another field.
			return fmt.Errorf("%s: field number %d is out of range", field, f.num)
		}
		switch f.wire {
		case wireVarint:
			if f.v, n = uvarint(b); n == 0 {
				return fmt.Errorf("%s: field %d: %w varint", field, f.num, errTruncated)
			}
			b = b[n:]
		case wireBytes:
			l, n := uvarint(b)
			if n == 0 || l > uint64(len(b)-n) {
				return fmt.Errorf("%s: field %d: %w length-delimited value", field, f.num, errTruncated)
			}
			f.data, b = b[n:n+int(l)], b[n+int(l):]
		case wireFixed64, wireFixed32:
			size := 8
			if f.wire == wireFixed32 {
				size = 4
			}
			if len(b) < size {
				return fmt.Errorf("%s: field %d: %w fixed-width value", field, f.num, errTruncated)
			}
			b = b[size:]
			continue
		default:
			return fmt.Errorf("%s: field %d: wire type %d is not supported", field, f.num, f.wire)
		}
		if err := fn(f); err != nil {
			return err
		}
	}
	return nil
}

// want checks that f has the wire type the schema gives its field.
func (f pbField) want(field string, wire uint64) error {
	if f.wire != wire {
		return fmt.Errorf("%s: wire type %d, want %d", field, f.wire, wire)
	}
	return nil
}

// fields calls fn with each field of the message f holds (pbEach), f being a
// length-delimited field as the schema gives it.
func (f pbField) fields(field string, fn func(f pbField) error) error {
	if err := f.want(field, wireBytes); err != nil {
		return err
	}
	return pbEach(field, f.data, fn)
}

func (f pbField) str(field string, to *string) error {
	if err := f.want(field, wireBytes); err != nil {
		return err
	}
	*to = pbString(f.data)
	return nil
}

// pbString is a protobuf string as the API server's JSON has it. Kubernetes'
// protobuf strings are any bytes (an object written in protobuf keeps them as
// they came), and encoding/json writes each byte that is not part of a UTF-8
// sequence as U+FFFD: the pod reads the same in either encoding.
func pbString(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	s := make([]byte, 0, len(b)+8)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			s = utf8.AppendRune(s, utf8.RuneError)
		} else {
			s = append(s, b[:n]...)
		}
		b = b[n:]
	}
	return string(s)
}

func (f pbField) int64(field string, to **int64) error {
	if err := f.want(field, wireVarint); err != nil {
		return err
	}
	n := int64(f.v) // int64 fields are plain (not zigzag) varints
	*to = &n
	return nil
}

// unwrapProtobuf returns the object's bytes from the envelope in data, checking
// that it holds an object of the kind wanted.
func unwrapProtobuf(data []byte, kind string) ([]byte, error) {
	if !isProtobuf(data) {
		return nil, fmt.Errorf("envelope: not Kubernetes' protobuf (it does not start with %q)", ProtobufMagic)
	}
	var gotKind, encoding string
	var raw []byte
	hasRaw := false
	err := pbEach("envelope", data[len(ProtobufMagic):], func(f pbField) error {
		switch f.num {
		case 1: // typeMeta
			return f.fields("envelope.typeMeta", func(f pbField) error {
				if f.num == 2 {
					return f.str("envelope.typeMeta.kind", &gotKind)
				}
				return nil
			})
		case 2:
			if err := f.want("envelope.raw", wireBytes); err != nil {
				return err
			}
			raw, hasRaw = f.data, true
		case 3:
			return f.str("envelope.contentEncoding", &encoding)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if encoding != "" {
		return nil, fmt.Errorf("envelope: content encoding %q is not supported", encoding)
	}
	if gotKind != kind {
		return nil, fmt.Errorf("envelope: kind %q, want %s", gotKind, kind)
	}
	if !hasRaw {
		return nil, fmt.Errorf("envelope: no object")
	}
	return raw, nil
}

// decodePodProtobuf fills p from a pod in the API server's protobuf encoding, the
// same fields decodePod reads from its JSON.
func decodePodProtobuf(data []byte, p *Pod) error {
	raw, err := unwrapProtobuf(data, "Pod")
	if err != nil {
		return err
	}
	return pbEach("Pod", raw, func(f pbField) error {
		switch f.num {
		case 1:
			return decodeMetaProtobuf(f, &p.Metadata)
		case 2:
			return decodeSpecProtobuf(f, &p.Spec)
		case 3:
			return decodeStatusProtobuf(f, &p.Status)
		}
		return nil
	})
}

func decodeMetaProtobuf(f pbField, m *ObjectMeta) error {
	return f.fields("metadata", func(f pbField) error {
		switch f.num {
		case 1:
			return f.str("metadata.name", &m.Name)
		case 3:
			return f.str("metadata.namespace", &m.Namespace)
		case 5:
			return f.str("metadata.uid", &m.UID)
		case 9:
			// A meta/v1 Time: seconds (1) and nanos (2), which the API machinery
			// neither writes nor reads (its JSON has whole seconds). The zero time
			// (an empty message, as the API machinery reads and writes it) is
			// JSON's null.
			var sec int64
			err := f.fields("metadata.deletionTimestamp", func(f pbField) error {
				if f.num != 1 && f.num != 2 {
					return nil
				}
				if err := f.want("metadata.deletionTimestamp", wireVarint); err != nil {
					return err
				}
				if f.num == 1 {
					sec = int64(f.v)
				}
				return nil
			})
			if err != nil {
				return err
			}
			m.DeletionTimestamp = nil
			if t := time.Unix(sec, 0).UTC(); len(f.data) > 0 && !t.IsZero() {
				m.DeletionTimestamp = &t
			}
		case 11:
			return decodeMapEntryProtobuf("metadata.labels", f, &m.Labels)
		case 12:
			return decodeMapEntryProtobuf("metadata.annotations", f, &m.Annotations)
		}
		return nil
	})
}

// decodeMapEntryProtobuf adds one entry of a map<string, string> (a message of
// key 1 and value 2) to *to; a key given again takes its last value.
func decodeMapEntryProtobuf(field string, f pbField, to *map[string]string) error {
	var k, v string
	err := f.fields(field, func(f pbField) error {
		switch f.num {
		case 1:
			return f.str(field, &k)
		case 2:
			return f.str(field, &v)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if *to == nil {
		*to = map[string]string{}
	}
	(*to)[k] = v
	return nil
}

func decodeSpecProtobuf(f pbField, s *PodSpec) error {
	return f.fields("spec", func(f pbField) error {
		switch f.num {
		case 2:
			return decodeContainerProtobuf("spec.containers", f, &s.Containers)
		case 20:
			return decodeContainerProtobuf("spec.initContainers", f, &s.InitContainers)
		case 10:
			return f.str("spec.nodeName", &s.NodeName)
		case 14:
			if s.SecurityContext == nil {
				s.SecurityContext = &PodSecurityContext{}
			}
			sc := s.SecurityContext
			return f.fields("spec.securityContext", func(f pbField) error {
				switch f.num {
				case 2:
					return f.int64("spec.securityContext.runAsUser", &sc.RunAsUser)
				case 6:
					return f.int64("spec.securityContext.runAsGroup", &sc.RunAsGroup)
				}
				return nil
			})
		}
		return nil
	})
}

// decodeContainerProtobuf appends the container in f to *to.
func decodeContainerProtobuf(field string, f pbField, to *[]Container) error {
	var c Container
	err := f.fields(field, func(f pbField) error {
		switch f.num {
		case 1:
			return f.str(field+".name", &c.Name)
		case 2:
			return f.str(field+".image", &c.Image)
		case 4:
			var a string
			if err := f.str(field+".args", &a); err != nil {
				return err
			}
			c.Args = append(c.Args, a)
		case 6:
			var p ContainerPort
			err := f.fields(field+".ports", func(f pbField) error {
				switch f.num {
				case 1:
					return f.str(field+".ports.name", &p.Name)
				case 3:
					if err := f.want(field+".ports.containerPort", wireVarint); err != nil {
						return err
					}
					p.ContainerPort = int32(f.v) // int32 fields are plain varints too
				case 4:
					return f.str(field+".ports.protocol", &p.Protocol)
				}
				return nil
			})
			if err != nil {
				return err
			}
			c.Ports = append(c.Ports, p)
		case 7:
			var e EnvVar
			err := f.fields(field+".env", func(f pbField) error {
				switch f.num {
				case 1:
					return f.str(field+".env.name", &e.Name)
				case 2:
					return f.str(field+".env.value", &e.Value)
				}
				return nil
			})
			if err != nil {
				return err
			}
			c.Env = append(c.Env, e)
		case 15:
			if c.SecurityContext == nil {
				c.SecurityContext = &SecurityContext{}
			}
			sc := c.SecurityContext
			return f.fields(field+".securityContext", func(f pbField) error {
				switch f.num {
				case 4:
					return f.int64(field+".securityContext.runAsUser", &sc.RunAsUser)
				case 8:
					return f.int64(field+".securityContext.runAsGroup", &sc.RunAsGroup)
				}
				return nil
			})
		case 24:
			return f.str(field+".restartPolicy", &c.RestartPolicy)
		}
		return nil
	})
	if err != nil {
		return err
	}
	*to = append(*to, c)
	return nil
}

func decodeStatusProtobuf(f pbField, s *PodStatus) error {
	return f.fields("status", func(f pbField) error {
		switch f.num {
		case 1:
			return f.str("status.phase", &s.Phase)
		case 6:
			return f.str("status.podIP", &s.PodIP)
		case 12:
			var ip PodIP
			err := f.fields("status.podIPs", func(f pbField) error {
				if f.num == 1 {
					return f.str("status.podIPs.ip", &ip.IP)
				}
				return nil
			})
			if err != nil {
				return err
			}
			s.PodIPs = append(s.PodIPs, ip)
		}
		return nil
	})
}

// decodeStatusErrorProtobuf reads the reason and message of an API error (a
// meta/v1 Status) in the protobuf encoding.
func decodeStatusErrorProtobuf(data []byte, reason, message *string) error {
	raw, err := unwrapProtobuf(data, "Status")
	if err != nil {
		return err
	}
	return pbEach("Status", raw, func(f pbField) error {
		switch f.num {
		case 3:
			return f.str("Status.message", message)
		case 4:
			return f.str("Status.reason", reason)
		}
		return nil
	})
}
