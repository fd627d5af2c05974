package manifest

import (
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Schema returns the JSON Schema (draft 2020-12) of manifests of kind k, generated from the
// API message its spec is, so editors and CI validators check a manifest as Decode would:
// unknown fields are errors (additionalProperties false), enums list their names.
func (k *Kind) Schema() map[string]any {
	meta := map[string]any{
		"name": map[string]any{"type": "string", "pattern": dnsLabel.String()},
		"annotations": map[string]any{
			"type": "object", "additionalProperties": map[string]any{"type": "string"},
			"description": "Notes for readers; apply does not store them.",
		},
	}
	metaRequired := []string{}
	if !k.NameOptional {
		metaRequired = append(metaRequired, "name")
	}
	if k.Project {
		meta["project"] = map[string]any{"type": "string", "pattern": dnsLabel.String()}
		metaRequired = append(metaRequired, "project")
	}
	if k.Labels {
		meta["labels"] = map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "string"}}
	}
	metaSchema := map[string]any{"type": "object", "properties": meta, "additionalProperties": false}
	if len(metaRequired) > 0 {
		metaSchema["required"] = metaRequired
	}
	return map[string]any{
		"$schema":     "https://json-schema.org/draft/2020-12/schema",
		"$id":         "https://fleetstream.io/schemas/v1alpha1/" + k.Name + ".json",
		"title":       k.Name,
		"description": k.Description,
		"type":        "object",
		"properties": map[string]any{
			"apiVersion": map[string]any{"const": APIVersion},
			"kind":       map[string]any{"const": k.Name},
			"metadata":   metaSchema,
			"spec":       k.messageSchema(k.Spec.ProtoReflect().Descriptor(), ""),
		},
		"required":             []string{"apiVersion", "kind", "metadata"},
		"additionalProperties": false,
	}
}

func (k *Kind) messageSchema(md protoreflect.MessageDescriptor, ppath string) map[string]any {
	props := map[string]any{}
	for i := 0; i < md.Fields().Len(); i++ {
		fd := md.Fields().Get(i)
		if !k.settable(ppath, fd) {
			continue
		}
		fp := string(fd.Name())
		if ppath != "" {
			fp = ppath + "." + fp
		}
		var s map[string]any
		switch {
		case fd.IsMap():
			s = map[string]any{"type": "object", "additionalProperties": k.valueSchema(fd.MapValue(), fp)}
		case fd.IsList():
			s = map[string]any{"type": "array", "items": k.valueSchema(fd, fp)}
		default:
			s = k.valueSchema(fd, fp)
		}
		props[fd.JSONName()] = s
	}
	return map[string]any{"type": "object", "properties": props, "additionalProperties": false}
}

func (k *Kind) valueSchema(fd protoreflect.FieldDescriptor, ppath string) map[string]any {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return k.messageSchema(fd.Message(), ppath)
	case protoreflect.BoolKind:
		return map[string]any{"type": "boolean"}
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return map[string]any{"type": "integer"}
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return map[string]any{"type": []string{"integer", "string"}}
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return map[string]any{"type": "number"}
	case protoreflect.EnumKind:
		var names []string
		vals := fd.Enum().Values()
		for i := 0; i < vals.Len(); i++ {
			if vals.Get(i).Number() != 0 {
				names = append(names, string(vals.Get(i).Name()))
			}
		}
		return map[string]any{"type": "string", "enum": names}
	default:
		return map[string]any{"type": "string"}
	}
}
