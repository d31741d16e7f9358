//! X2: what `pcmail-ctl schema` and `pcmail-ctl explain` print, both written from the field
//! table of [`super::fields`] (the one apply's validation takes its ranges from).

use serde_json::{Map, Value, json};

use super::fields::{Field, KINDS, Ty, kind_fields};
use super::{API_VERSION, Kind};

/// T6's name rule as a regular expression (`text::is_name`).
pub const NAME_PATTERN: &str = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$";
/// One line: no control character, line or paragraph separator, or bidi override (`text::check_line`).
const LINE_PATTERN: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f\\u2028\\u2029\\u202a-\\u202e\\u2066-\\u2069]*$";
/// The manifest notation of a duration (`duration::Dur`'s parser).
const DURATION_PATTERN: &str = "^\\s*([0-9]+(ms|s|m|h|d))+\\s*$";
/// A duration with a digit other than 0: longer than 0s.
const POSITIVE_DURATION_PATTERN: &str = "^\\s*([0-9]+(ms|s|m|h|d))*0*[1-9][0-9]*(ms|s|m|h|d)([0-9]+(ms|s|m|h|d))*\\s*$";
/// Five fields apart (`cron::Cron`'s parser splits on whitespace).
const CRON_PATTERN: &str = "^\\s*\\S+(\\s+\\S+){4}\\s*$";

/// The JSON Schema (draft 2020-12) of every manifest document: `kind` picks its spec's schema.
pub fn json_schema() -> Value {
    let kinds: Vec<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
    let by_kind: Vec<Value> = KINDS
        .iter()
        .map(|k| {
            json!({
                "if": {"properties": {"kind": {"const": k.kind.as_str()}}, "required": ["kind"]},
                "then": {"properties": {"spec": {"$ref": format!("#/$defs/{}", k.kind)}}},
            })
        })
        .collect();
    let defs: Map<String, Value> = KINDS
        .iter()
        .map(|k| {
            let mut spec = object(k.spec);
            spec["description"] = json!(k.description);
            (k.kind.to_string(), spec)
        })
        .collect();
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": format!("pcmail manifest ({API_VERSION})"),
        "description": "One document of a pcmail manifest file; written by `pcmail-ctl schema` from the table apply validates with.",
        "type": "object",
        "properties": {
            "apiVersion": {"const": API_VERSION, "description": "Always pcmail/v1."},
            "kind": {"enum": kinds, "description": "The kind of object."},
            "metadata": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "pattern": NAME_PATTERN, "description": "The object's name, unique within its kind."},
                    "labels": {
                        "type": "object",
                        "propertyNames": {"minLength": 1, "maxLength": 63, "pattern": "^[^\\s\\u0000-\\u001f\\u007f-\\u009f\\u2028\\u2029\\u202a-\\u202e\\u2066-\\u2069]*$"},
                        "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LINE_PATTERN},
                        "description": "Labels: keys and values of one line of at most 63 characters.",
                    },
                    "generation": {"description": "Written by the controller; ignored by apply."},
                    "creationTimestamp": {"description": "Written by the controller; ignored by apply."},
                },
                "required": ["name"],
                "additionalProperties": false,
            },
            "spec": {"type": "object", "description": "What the object should be; its fields depend on kind."},
            "status": {"description": "Written by the controller; ignored by apply."},
        },
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": false,
        "allOf": by_kind,
        "$defs": defs,
    })
}

fn object(fields: &[Field]) -> Value {
    let properties: Map<String, Value> = fields
        .iter()
        .map(|f| {
            let mut p = of(&f.ty);
            p["description"] = json!(f.description);
            if let Some(d) = f.default.and_then(|d| serde_yaml_ng::from_str::<Value>(d).ok()) {
                p["default"] = d;
            }
            (f.name.to_string(), p)
        })
        .collect();
    let required: Vec<&str> = fields.iter().filter(|f| f.required).map(|f| f.name).collect();
    json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false})
}

fn of(ty: &Ty) -> Value {
    match ty {
        Ty::Line => json!({"type": "string", "pattern": LINE_PATTERN}),
        Ty::Word => json!({"type": "string", "minLength": 1, "pattern": LINE_PATTERN}),
        Ty::Text => json!({"type": "string", "pattern": "^[^\\u0000]*$"}),
        Ty::Name => json!({"type": "string", "pattern": NAME_PATTERN}),
        Ty::Url => {
            json!({"type": "string", "pattern": "^https?://[^\\u0000-\\u001f\\u007f-\\u009f\\u2028\\u2029\\u202a-\\u202e\\u2066-\\u2069]*$"})
        }
        Ty::Count { min, max } => json!({"type": "integer", "minimum": min, "maximum": max}),
        Ty::Integer => json!({"type": "integer"}),
        Ty::Duration { min, .. } if min.as_millis() > 0 => {
            json!({"type": "string", "pattern": POSITIVE_DURATION_PATTERN})
        }
        Ty::Duration { .. } => json!({"type": "string", "pattern": DURATION_PATTERN}),
        Ty::Cron => json!({"type": "string", "pattern": CRON_PATTERN}),
        Ty::TimeZone => {
            let names: Vec<&str> = chrono_tz::TZ_VARIANTS.iter().map(|tz| tz.name()).collect();
            json!({"type": "string", "enum": names})
        }
        Ty::Bool => json!({"type": "boolean"}),
        Ty::Enum(values) => json!({"type": "string", "enum": values}),
        Ty::Object(fields) => object(fields),
        Ty::List(t) => json!({"type": "array", "items": of(t)}),
        Ty::NonEmptyList(t) => json!({"type": "array", "items": of(t), "minItems": 1}),
        Ty::Map(t) => {
            json!({"type": "object", "propertyNames": {"pattern": "^[^=\\u0000]+$"}, "additionalProperties": of(t)})
        }
    }
}

/// Why `explain` has nothing to print.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExplainError {
    #[error(transparent)]
    UnknownKind(#[from] crate::names::UnknownName),
    #[error("{at} has no field {field:?}; its fields are {candidates}")]
    UnknownField { at: String, field: String, candidates: String },
}

/// kubectl explain for a manifest: `KIND` lists the spec's fields, `KIND.spec.field[.field…]`
/// (or `KIND.field…`) prints one field's type, default, allowed values and description.
/// Kind and field names match in any case.
pub fn explain(path: &str) -> Result<String, ExplainError> {
    let mut parts = path.split('.').filter(|p| !p.is_empty());
    let kind_name = parts.next().unwrap_or_default();
    let kind = Kind::parse_cli(kind_name)?;
    let table = kind_fields(kind);
    let mut names: Vec<&str> = parts.collect();
    if names.first().is_some_and(|n| n.eq_ignore_ascii_case("spec")) {
        names.remove(0);
    }
    let mut out = format!("KIND:     {kind}\nVERSION:  {API_VERSION}\n\n");
    let mut fields = table.spec;
    let mut at = format!("{}.spec", kind.cli_name());
    let mut field = None;
    for name in names {
        let f = find(fields, &at, name)?;
        at = format!("{at}.{}", f.name);
        fields = f.ty.fields().unwrap_or(&[]);
        field = Some(f);
    }
    let Some(field) = field else {
        out += &format!("DESCRIPTION:\n     {}\n\nFIELDS (spec):\n", table.description);
        out += &list(table.spec);
        return Ok(out);
    };
    let default = field.default.unwrap_or(if field.required { "none (required)" } else { "none" });
    out += &format!(
        "FIELD:    {} <{}>{}\n\n",
        at.split_once('.').map_or("", |(_, p)| p),
        field.ty.type_name(),
        flag(field)
    );
    out += &format!("DESCRIPTION:\n     {}\n\nDEFAULT:  {default}\n", field.description);
    let allowed = field.ty.allowed();
    if !allowed.is_empty() {
        out += &format!("ALLOWED:  {allowed}\n");
    }
    if let Some(inner) = field.ty.fields() {
        out += "\nFIELDS:\n";
        out += &list(inner);
    }
    Ok(out)
}

fn flag(f: &Field) -> &'static str {
    if f.required { " -required-" } else { "" }
}

fn find(fields: &'static [Field], at: &str, name: &str) -> Result<&'static Field, ExplainError> {
    fields.iter().find(|f| f.name.eq_ignore_ascii_case(name)).ok_or_else(|| {
        let names: Vec<&str> = fields.iter().map(|f| f.name).collect();
        ExplainError::UnknownField {
            at: at.to_string(),
            field: name.to_string(),
            candidates: if names.is_empty() { "none (it is not an object)".into() } else { names.join(", ") },
        }
    })
}

/// kubectl's field list: name, type and required flag, then the description indented.
fn list(fields: &[Field]) -> String {
    fields
        .iter()
        .map(|f| {
            let default = f.default.map(|d| format!(" (default {d})")).unwrap_or_default();
            format!("   {}\t<{}>{}\n     {}{default}\n\n", f.name, f.ty.type_name(), flag(f), f.description)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn x2_explain_prints_a_fields_type_default_and_description_in_any_case() {
        let out = explain("WORKERPOOL.spec.rateLimit").expect("a field");
        assert!(out.contains("FIELD:    spec.rateLimit <Object>"), "{out}");
        assert!(out.contains("DEFAULT:  none") && out.contains("perMinute\t<integer> -required-"), "{out}");
        let out = explain("workerpool.leaseduration").expect("spec. may be left out");
        assert!(out.contains("<duration>") && out.contains("DEFAULT:  60s") && out.contains("1s to 1d"), "{out}");
        let out = explain("schedule.spec.entries.role").expect("nested");
        assert!(out.contains("one of execute-checked, sync"), "{out}");
        let out = explain("roster").expect("a kind");
        assert!(out.contains("machines\t<[]Object> -required-") && out.contains("owner\t<string>"), "{out}");
    }

    #[test]
    fn x2_explain_of_an_unknown_field_or_kind_names_the_candidates() {
        let e = explain("workerpool.spec.ratelimt").expect_err("unknown");
        assert_eq!(e.to_string().split(';').next(), Some("workerpool.spec has no field \"ratelimt\""));
        assert!(e.to_string().contains("rateLimit, externalWorkers"), "{e}");
        let e = explain("workerpool.spec.workers.x").expect_err("not an object");
        assert!(e.to_string().contains("none (it is not an object)"), "{e}");
        let e = explain("pod").expect_err("unknown kind");
        assert!(e.to_string().contains("known kinds: roster, mailpolicy"), "{e}");
    }
}
