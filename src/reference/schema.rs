//! A JSON schema (a CRD's openAPIV3Schema, or schemars' for the config
//! file) flattened into one row per field: its dotted path, type, default,
//! bounds and description. The reference pages are tables of these rows.

use serde_json::Value;

/// The pattern our durations carry in the CRDs (`crate::duration`).
const DURATION_PATTERN: &str = "^([0-9]+(ms|s|m|h))+$";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub path: String,
    pub type_: String,
    pub required: bool,
    pub default: Option<String>,
    pub bounds: Vec<String>,
    pub description: String,
}

/// Every field under `schema`'s properties, depth first, in the schema's
/// order. `defs` resolves `$ref`s (schemars' `$defs`).
pub fn fields(schema: &Value, defs: &Value, prefix: &str) -> Vec<Field> {
    let mut out = vec![];
    walk(schema, defs, prefix, &mut out);
    out
}

fn walk(schema: &Value, defs: &Value, prefix: &str, out: &mut Vec<Field>) {
    let schema = resolve(schema, defs);
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, sub) in properties {
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        let sub = resolve(sub, defs);
        // The outer description wins: a `$ref` field's own doc comment
        // says what it is for, the type's says what the type is.
        let description = description_of(&sub);
        out.push(Field {
            path: path.clone(),
            type_: type_of(&sub, defs),
            required: required.contains(&name.as_str()),
            default: sub.get("default").filter(|d| !d.is_null()).map(compact),
            bounds: bounds_of(&sub, defs),
            description,
        });
        let items = sub.get("items").map(|i| resolve(i, defs));
        match items {
            Some(items) => walk(&items, defs, &format!("{path}[]"), out),
            None => walk(&sub, defs, &path, out),
        }
    }
}

/// `schema` with `$ref`, a one-element `allOf`, and a nullable `anyOf`
/// resolved, keeping the outer description and default.
fn resolve(schema: &Value, defs: &Value) -> Value {
    let mut merged = schema.clone();
    let inner = if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let name = r.rsplit('/').next().unwrap_or_default();
        defs.get(name).cloned()
    } else if let Some([one]) = schema
        .get("allOf")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
    {
        Some(resolve(one, defs))
    } else {
        schema
            .get("anyOf")
            .or_else(|| schema.get("oneOf"))
            .and_then(Value::as_array)
            .and_then(|alts| {
                let real: Vec<&Value> = alts
                    .iter()
                    .filter(|a| a.get("type").and_then(Value::as_str) != Some("null"))
                    .collect();
                (real.len() == 1).then(|| resolve(real[0], defs))
            })
    };
    if let (Some(inner), Some(obj)) = (inner, merged.as_object_mut()) {
        for key in ["$ref", "allOf", "anyOf", "oneOf"] {
            obj.remove(key);
        }
        if let Some(inner) = inner.as_object() {
            for (k, v) in inner {
                obj.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
    merged
}

fn description_of(schema: &Value) -> String {
    let text = schema
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or_default();
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn type_of(schema: &Value, defs: &Value) -> String {
    if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        return "int or string".into();
    }
    let named = match schema.get("type") {
        Some(Value::String(t)) => t.clone(),
        // schemars writes an Option as ["string", "null"].
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("any")
            .to_string(),
        _ if schema.get("enum").is_some() || schema.get("oneOf").is_some() => "string".into(),
        _ => "any".into(),
    };
    match named.as_str() {
        "string" if schema.get("pattern").and_then(Value::as_str) == Some(DURATION_PATTERN) => {
            "duration".into()
        }
        "string" if schema.get("format").and_then(Value::as_str) == Some("date-time") => {
            "time".into()
        }
        "array" => {
            let items = schema
                .get("items")
                .map(|i| resolve(i, defs))
                .unwrap_or(Value::Null);
            format!("[]{}", type_of(&items, defs))
        }
        "object" if schema.get("properties").is_none() => {
            match schema.get("additionalProperties") {
                Some(v) if v.is_object() => format!("map[string]{}", type_of(v, defs)),
                _ => "object".into(),
            }
        }
        _ => named,
    }
}

fn bounds_of(schema: &Value, defs: &Value) -> Vec<String> {
    let num = |k: &str| {
        schema
            .get(k)
            .and_then(Value::as_f64)
            .map(|n| format!("{n}"))
    };
    let mut out = vec![];
    match (num("minimum"), num("maximum")) {
        (Some(lo), Some(hi)) => out.push(format!("{lo} to {hi}")),
        (Some(lo), None) => out.push(format!("at least {lo}")),
        (None, Some(hi)) => out.push(format!("at most {hi}")),
        (None, None) => {}
    }
    for (key, what) in [
        ("minLength", "length at least"),
        ("maxLength", "length at most"),
        ("minItems", "at least"),
        ("maxItems", "at most"),
    ] {
        if let Some(n) = num(key) {
            let unit = if key.ends_with("Items") {
                " item(s)"
            } else {
                ""
            };
            out.push(format!("{what} {n}{unit}"));
        }
    }
    if let Some(values) = enum_values(schema, defs) {
        out.push(format!("one of {}", values.join(", ")));
    }
    if let Some(p) = schema.get("pattern").and_then(Value::as_str)
        && p != DURATION_PATTERN
    {
        out.push(format!("pattern `{p}`"));
    }
    out
}

/// The values of a string enum: the CRDs' `enum`, or schemars' `oneOf` of
/// `const`s (one per documented variant).
fn enum_values(schema: &Value, defs: &Value) -> Option<Vec<String>> {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return Some(values.iter().map(|v| format!("`{}`", plain(v))).collect());
    }
    let alts = schema.get("oneOf").and_then(Value::as_array)?;
    let values: Vec<String> = alts
        .iter()
        .map(|a| resolve(a, defs))
        .filter_map(|a| {
            a.get("const")
                .cloned()
                .or_else(|| a.get("enum").and_then(|e| e.get(0)).cloned())
        })
        .map(|v| format!("`{}`", plain(&v)))
        .collect();
    (!values.is_empty()).then_some(values)
}

fn plain(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

fn compact(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `text` safe in a Markdown table cell.
pub fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// A Markdown table of `fields`: field, type, default, bounds, meaning.
pub fn table(fields: &[Field]) -> String {
    let mut out =
        String::from("| field | type | default | bounds | meaning |\n|---|---|---|---|---|\n");
    for f in fields {
        let default = match (&f.default, f.required) {
            (Some(d), _) => format!("`{}`", cell(d)),
            (None, true) => "required".into(),
            (None, false) => String::new(),
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            f.path,
            cell(&f.type_),
            default,
            cell(&f.bounds.join("; ")),
            cell(&f.description)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fields_are_flattened_with_type_default_and_bounds() {
        let schema = json!({
            "type": "object",
            "required": ["count"],
            "properties": {
                "count": {"type": "integer", "minimum": 0.0, "maximum": 10.0, "description": "How many;\n at most ten."},
                "wait": {"type": "string", "pattern": DURATION_PATTERN, "default": "5m"},
                "mode": {"type": "string", "enum": ["A", "B"]},
                "items": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
                "nested": {"$ref": "#/$defs/Nested", "description": "Outer words."}
            }
        });
        let defs = json!({"Nested": {"type": "object", "description": "Inner words.",
            "properties": {"on": {"type": ["boolean", "null"]}}}});
        let f = fields(&schema, &defs, "spec");
        let row = |p: &str| f.iter().find(|r| r.path == p).cloned().expect(p);
        assert_eq!(row("spec.count").bounds, vec!["0 to 10"]);
        assert!(row("spec.count").required);
        assert_eq!(row("spec.count").description, "How many; at most ten.");
        assert_eq!(row("spec.wait").type_, "duration");
        assert_eq!(row("spec.wait").default.as_deref(), Some("5m"));
        assert_eq!(row("spec.mode").bounds, vec!["one of `A`, `B`"]);
        assert_eq!(row("spec.items").type_, "[]object");
        assert_eq!(row("spec.items[].name").type_, "string");
        assert_eq!(row("spec.nested").description, "Outer words.");
        assert_eq!(row("spec.nested.on").type_, "boolean");
        assert!(table(&f).contains("| `spec.count` | integer | required | 0 to 10 |"));
    }
}
