//! The JSON schema of an LLM reply, derived from the Rust type the reply is parsed into
//! (schemars), in the strict form structured outputs take: every property required, in the order
//! the type declares them (the prompts rely on it: reasoning before the answer), no other property
//! allowed, and only the keywords the server's grammar uses.

use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

/// A structured output: its JSON schema goes to the server, which constrains decoding to it (in
/// the order its properties are written: reasoning keys first, see `llm.reasoning_first`).
pub struct Schema {
    pub name: &'static str,
    pub schema: Value,
}

impl Schema {
    /// The schema of `T`, named `name` in the request.
    pub fn of<T: JsonSchema>(name: &'static str) -> Schema {
        let mut settings = SchemaSettings::draft07();
        // One self-contained schema: the grammar converters handle `$ref` unevenly.
        settings.inline_subschemas = true;
        let derived = settings.into_generator().into_root_schema_for::<T>();
        Schema { name, schema: strict(derived.as_value()) }
    }

    /// Caps the array property `property` at `max` items: a bound that comes from the settings,
    /// not from the type.
    pub fn with_max_items(mut self, property: &str, max: usize) -> Schema {
        if let Some(array) = self.schema["properties"].get_mut(property).and_then(Value::as_object_mut) {
            array.insert("maxItems".into(), json!(max));
        }
        self
    }
}

/// `schema` in the strict form, keyword by keyword. Titles, descriptions, formats and defaults are
/// dropped: they would change the request, not what the grammar allows.
///
/// The keywords go out in a fixed order. An array of objects states its bounds before its (long)
/// item schema, an array of scalars after: the order the schemas had when they were written by
/// hand, kept so that the requests, and with them the LLM cache's keys, stay the same byte for byte.
fn strict(schema: &Value) -> Value {
    let mut out = Map::new();
    for keyword in ["type", "enum"] {
        if let Some(value) = schema.get(keyword) {
            out.insert(keyword.into(), value.clone());
        }
    }
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        let shaped: Map<String, Value> = properties.iter().map(|(key, value)| (key.clone(), strict(value))).collect();
        let required: Vec<&String> = properties.keys().collect();
        out.insert("properties".into(), Value::Object(shaped));
        out.insert("required".into(), json!(required));
        out.insert("additionalProperties".into(), json!(false));
    }
    if let Some(items) = schema.get("items") {
        let items = strict(items);
        let bounds: Vec<(String, Value)> = ["minItems", "maxItems"]
            .iter()
            .filter_map(|keyword| Some((keyword.to_string(), schema.get(*keyword)?.clone())))
            .collect();
        if items["type"] == "object" {
            out.extend(bounds);
            out.insert("items".into(), items);
        } else {
            out.insert("items".into(), items);
            out.extend(bounds);
        }
    }
    Value::Object(out)
}

/// The 1-5 confidence every answering schema asks for: an integer of the five, whatever type the
/// field is parsed into (`#[schemars(with = "Confidence")]`).
pub struct Confidence;

impl JsonSchema for Confidence {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Confidence".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "integer", "enum": [1, 2, 3, 4, 5] })
    }
}
