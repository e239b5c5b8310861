//! The tools `capwire mcp` offers: one per `app.*` verb of the nodes it
//! serves, made from their manifests (as `ctl manifest --json` has them)
//! with no I/O. Names are valid MCP tool names that the strictest clients
//! take too (`[A-Za-z0-9_-]`, at most 64 characters), stable, and unique:
//!
//! ```text
//! NODE__CAP__VERB     node "agent-1", app.agent/echo ─► agent-1__agent__echo
//! ```
//!
//! `app.` is left out of the capability and every other character is
//! `_`; a name that is too long or taken already is cut and ends with 8
//! hex digits of a hash of the node's id, capability and verb.
//!
//! An MCP tool takes and gives JSON objects. A verb whose args are not an
//! object is given a tool whose input is `{"value": ARGS}`; a request's
//! result that is not an object comes as `{"result": RESULT}`; a stream's
//! items as `{"items": [...], "count": N, "truncated": BOOL}`; a task's
//! outcome as `{"task": ID, "result": RESULT}`; a notification's as
//! `{"sent": true}`.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde_json::{Map, Value as Json, json};

use crate::ctl::card::app_verbs;

/// The longest tool name made.
pub(crate) const MAX_NAME: usize = 64;

/// How a verb is called, from its manifest's `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Request,
    Notification,
    Stream,
    Task,
}

impl Kind {
    fn parse(text: &str) -> Option<Kind> {
        Some(match text {
            "request" => Kind::Request,
            "notification" => Kind::Notification,
            "stream" => Kind::Stream,
            "task" => Kind::Task,
            _ => return None,
        })
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Request => "request",
            Kind::Notification => "notification",
            Kind::Stream => "stream",
            Kind::Task => "task",
        }
    }
}

/// One tool: what it calls and how it is shown.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolDef {
    pub(crate) name: String,
    /// The node's name in the control plane's book.
    pub(crate) node: String,
    pub(crate) node_id: String,
    pub(crate) cap: String,
    pub(crate) verb: String,
    pub(crate) kind: Kind,
    pub(crate) controller: bool,
    pub(crate) title: String,
    pub(crate) description: String,
    pub(crate) input_schema: Map<String, Json>,
    pub(crate) output_schema: Option<Map<String, Json>>,
    /// The args are the tool's `value` argument.
    pub(crate) wrapped_input: bool,
    /// A request's result is the tool's `result`.
    pub(crate) wrapped_output: bool,
}

impl ToolDef {
    /// The verb's args from the tool's arguments.
    ///
    /// # Errors
    /// What is wrong with them, for a verb whose args are wrapped.
    pub(crate) fn args(&self, arguments: Option<Map<String, Json>>) -> Result<Json, String> {
        let arguments = arguments.unwrap_or_default();
        if !self.wrapped_input {
            return Ok(Json::Object(arguments));
        }
        let mut arguments = arguments;
        let value = arguments
            .remove("value")
            .ok_or_else(|| format!("{} takes its args as the argument \"value\"", self.name))?;
        if let Some(other) = arguments.keys().next() {
            return Err(format!(
                "{} takes one argument, \"value\" (not {other:?})",
                self.name
            ));
        }
        Ok(value)
    }

    /// A request's result as the tool's structured output.
    pub(crate) fn output(&self, result: Json) -> Json {
        if self.wrapped_output {
            json!({ "result": result })
        } else {
            result
        }
    }
}

/// A node as the catalog takes it: its book entry and its manifest.
#[derive(Debug, Clone)]
pub(crate) struct NodeView {
    /// Its name in the book.
    pub(crate) name: String,
    /// Its addresses in the book.
    pub(crate) addrs: Vec<String>,
    /// Its `manifest` record (`ctl manifest --json`).
    pub(crate) manifest: Json,
}

/// The tools of a set of nodes, by name; and the names the controller
/// verbs would have had, so that a call of one is refused with the reason.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Catalog {
    pub(crate) tools: Vec<ToolDef>,
    by_name: HashMap<String, usize>,
    hidden: HashMap<String, String>,
}

impl Catalog {
    /// The tools of `nodes`' `app.*` verbs; controller verbs only when
    /// `controller` allows them.
    pub(crate) fn build(nodes: &[NodeView], controller: bool) -> Catalog {
        let mut all = Vec::new();
        for node in nodes {
            all.extend(tools_of(node));
        }
        all.sort_by(|a, b| {
            (&a.node, &a.cap, &a.verb, &a.node_id).cmp(&(&b.node, &b.cap, &b.verb, &b.node_id))
        });
        let mut taken: HashMap<String, usize> = HashMap::new();
        let mut catalog = Catalog::default();
        for mut tool in all {
            tool.name = unique_name(&tool, &taken);
            taken.insert(tool.name.clone(), 0);
            if tool.controller && !controller {
                catalog.hidden.insert(
                    tool.name.clone(),
                    format!("{}/{} of {}", tool.cap, tool.verb, tool.node),
                );
                continue;
            }
            catalog
                .by_name
                .insert(tool.name.clone(), catalog.tools.len());
            catalog.tools.push(tool);
        }
        catalog
    }

    /// The tool named `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&ToolDef> {
        self.position(name).map(|i| &self.tools[i])
    }

    /// Where the tool named `name` is in `tools`.
    pub(crate) fn position(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// What a controller verb left out under `name` is, if it is one.
    pub(crate) fn hidden(&self, name: &str) -> Option<&str> {
        self.hidden.get(name).map(String::as_str)
    }
}

/// Every `app.*` verb of `node` as a tool with its plain name.
fn tools_of(node: &NodeView) -> Vec<ToolDef> {
    let m = &node.manifest;
    let node_id = m["node_id"].as_str().unwrap_or_default().to_owned();
    let about = m["description"].as_str().unwrap_or_default();
    let mut tools = Vec::new();
    for (cap, cap_id, verb, name) in app_verbs(m) {
        let version = cap["version"].as_str().unwrap_or_default();
        let Some(kind) = verb["kind"].as_str().and_then(Kind::parse) else {
            continue;
        };
        let controller = match verb["class"].as_str() {
            Some("bootstrap") => false,
            Some("controller") => true,
            // A class this side does not know is never a tool.
            _ => continue,
        };
        let args = verb["args_schema"].as_object().cloned();
        let result = verb["result_schema"].as_object().cloned();
        let (input_schema, wrapped_input) = input_schema(args.as_ref());
        let (output_schema, wrapped_output) = output_schema(kind, result.as_ref());
        let mut description = format!(
            "{cap_id}/{name} (version {version}) of the capwire node {}: a {} verb{}.",
            node.name,
            kind.as_str(),
            if controller {
                ", run with the control plane's authority"
            } else {
                ""
            }
        );
        if let Some(text) = args
            .as_ref()
            .and_then(|s| s.get("description"))
            .and_then(Json::as_str)
        {
            let _ = write!(description, " Args: {text}");
        }
        if !about.is_empty() {
            let _ = write!(description, " The node: {about}");
        }
        tools.push(ToolDef {
            name: plain_name(&node.name, cap_id, name),
            node: node.name.clone(),
            node_id: node_id.clone(),
            cap: cap_id.to_owned(),
            verb: name.to_owned(),
            kind,
            controller,
            title: format!("{}: {cap_id}/{name}", node.name),
            description,
            input_schema,
            output_schema,
            wrapped_input,
            wrapped_output,
        });
    }
    tools
}

fn is_object_schema(schema: &Map<String, Json>) -> bool {
    schema.get("type").and_then(Json::as_str) == Some("object")
}

/// `schema` as the property `key` of an object schema: its `$defs` (and
/// `definitions`) go to the top, where its `#/$defs/...` references
/// point.
fn wrapped(key: &str, schema: &Map<String, Json>) -> Map<String, Json> {
    let mut inner = schema.clone();
    let mut outer = Map::new();
    outer.insert("type".into(), json!("object"));
    for top in ["$schema", "$defs", "definitions"] {
        if let Some(v) = inner.remove(top) {
            outer.insert(top.into(), v);
        }
    }
    outer.insert("properties".into(), json!({ key: inner }));
    outer.insert("required".into(), json!([key]));
    outer.insert("additionalProperties".into(), json!(false));
    outer
}

fn input_schema(args: Option<&Map<String, Json>>) -> (Map<String, Json>, bool) {
    match args {
        Some(schema) if is_object_schema(schema) => (schema.clone(), false),
        Some(schema) => (wrapped("value", schema), true),
        // A raw verb that declares no schema: an object, as it is.
        None => {
            let mut any = Map::new();
            any.insert("type".into(), json!("object"));
            (any, false)
        }
    }
}

fn output_schema(
    kind: Kind,
    result: Option<&Map<String, Json>>,
) -> (Option<Map<String, Json>>, bool) {
    match kind {
        Kind::Request => match result {
            Some(schema) if is_object_schema(schema) => (Some(schema.clone()), false),
            Some(schema) => (Some(wrapped("result", schema)), true),
            None => (None, true),
        },
        Kind::Notification => (
            json!({"type": "object", "properties": {"sent": {"type": "boolean"}}, "required": ["sent"]})
                .as_object()
                .cloned(),
            false,
        ),
        Kind::Stream => {
            let mut items = json!({"type": "array"});
            let mut outer = Map::new();
            if let Some(schema) = result {
                let mut item = schema.clone();
                for top in ["$schema", "$defs", "definitions"] {
                    if let Some(v) = item.remove(top) {
                        outer.insert(top.into(), v);
                    }
                }
                items["items"] = Json::Object(item);
            }
            outer.insert("type".into(), json!("object"));
            outer.insert(
                "properties".into(),
                json!({"items": items, "count": {"type": "integer"}, "truncated": {"type": "boolean"}}),
            );
            outer.insert("required".into(), json!(["items", "count", "truncated"]));
            (Some(outer), false)
        }
        Kind::Task => {
            let mut outer = match result {
                Some(schema) => wrapped("result", schema),
                None => json!({"type": "object", "required": ["result"]})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            };
            outer.remove("additionalProperties");
            let props = outer
                .entry("properties")
                .or_insert_with(|| json!({}));
            props["task"] = json!({"type": "string"});
            outer.insert("required".into(), json!(["task", "result"]));
            (Some(outer), false)
        }
    }
}

/// Characters outside `[A-Za-z0-9_-]` as `_`.
fn sanitize(text: &str) -> String {
    let clean: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.is_empty() { "_".into() } else { clean }
}

fn plain_name(node: &str, cap: &str, verb: &str) -> String {
    let cap = cap.strip_prefix("app.").unwrap_or(cap);
    format!("{}__{}__{}", sanitize(node), sanitize(cap), sanitize(verb))
}

/// FNV-1a, 64 bits: the same names from one build to the next.
fn fnv(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.bytes().chain([0]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

fn unique_name(tool: &ToolDef, taken: &HashMap<String, usize>) -> String {
    if tool.name.len() <= MAX_NAME && !taken.contains_key(&tool.name) {
        return tool.name.clone();
    }
    let mut salt = 0u32;
    loop {
        let salt_text = salt.to_string();
        let hash = fnv(&[&tool.node_id, &tool.cap, &tool.verb, &salt_text]);
        let suffix = format!("_{:08x}", hash & 0xffff_ffff);
        // The plain name is ASCII: any byte is a character boundary.
        let keep = tool.name.len().min(MAX_NAME - suffix.len());
        let name = format!("{}{suffix}", &tool.name[..keep]);
        if !taken.contains_key(&name) {
            return name;
        }
        salt += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, id: &str, verbs: Json) -> NodeView {
        NodeView {
            name: name.into(),
            addrs: vec!["127.0.0.1:7000".into()],
            manifest: json!({
                "kind": "manifest", "node_id": id, "name": name, "description": "an agent",
                "capabilities": [
                    {"id": "core.monitoring", "version": "1.0.0", "verbs": [
                        {"name": "status", "kind": "request", "class": "bootstrap",
                         "args_schema": null, "result_schema": null}]},
                    {"id": "app.agent", "version": "1.2.0", "verbs": verbs},
                ],
            }),
        }
    }

    fn verbs() -> Json {
        json!([
            {"name": "echo", "kind": "request", "class": "bootstrap",
             "args_schema": {"type": "string"}, "result_schema": {"type": "string"}},
            {"name": "ask", "kind": "request", "class": "controller",
             "args_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
             "result_schema": {"type": "string"}},
            {"name": "tell", "kind": "stream", "class": "bootstrap",
             "args_schema": {"type": "string"}, "result_schema": {"type": "string"}},
            {"name": "work", "kind": "task", "class": "bootstrap",
             "args_schema": {"type": "object", "$defs": {"N": {"type": "integer"}},
                             "properties": {"steps": {"$ref": "#/$defs/N"}}},
             "result_schema": {"type": "string"}},
            {"name": "note", "kind": "notification", "class": "bootstrap",
             "args_schema": null, "result_schema": null},
            {"name": "odd", "kind": "sideways", "class": "bootstrap",
             "args_schema": null, "result_schema": null},
        ])
    }

    #[test]
    fn app_verbs_only_and_controller_verbs_on_request() {
        let nodes = [node("agent-1", "aa", verbs())];
        let bootstrap = Catalog::build(&nodes, false);
        let names: Vec<&str> = bootstrap.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "agent-1__agent__echo",
                "agent-1__agent__note",
                "agent-1__agent__tell",
                "agent-1__agent__work"
            ]
        );
        assert!(bootstrap.get("agent-1__agent__ask").is_none());
        assert_eq!(
            bootstrap.hidden("agent-1__agent__ask"),
            Some("app.agent/ask of agent-1")
        );
        let all = Catalog::build(&nodes, true);
        let ask = all
            .get("agent-1__agent__ask")
            .expect("listed with the flag");
        assert!(ask.controller);
        assert!(ask.description.contains("control plane's authority"));
        assert_eq!(all.hidden("agent-1__agent__ask"), None);
    }

    #[test]
    fn schemas_that_are_not_objects_are_wrapped() {
        let catalog = Catalog::build(&[node("a", "aa", verbs())], false);
        let echo = catalog.get("a__agent__echo").expect("echo");
        assert!(echo.wrapped_input && echo.wrapped_output);
        assert_eq!(echo.input_schema["properties"]["value"]["type"], "string");
        assert_eq!(
            echo.args(Some(
                json!({"value": "hi"})
                    .as_object()
                    .cloned()
                    .unwrap_or_default()
            )),
            Ok(json!("hi"))
        );
        assert!(echo.args(None).is_err());
        assert!(
            echo.args(json!({"value": 1, "more": 2}).as_object().cloned())
                .is_err_and(|e| e.contains("\"more\""))
        );
        assert_eq!(echo.output(json!("a: hi")), json!({"result": "a: hi"}));

        let work = catalog.get("a__agent__work").expect("work");
        assert!(!work.wrapped_input);
        assert_eq!(work.input_schema["$defs"]["N"]["type"], "integer");
        let out = work.output_schema.as_ref().expect("a task's output");
        assert_eq!(out["required"], json!(["task", "result"]));
        assert_eq!(out["properties"]["result"]["type"], "string");

        let tell = catalog.get("a__agent__tell").expect("tell");
        let out = tell.output_schema.as_ref().expect("a stream's output");
        assert_eq!(out["properties"]["items"]["items"]["type"], "string");

        // No schema: any object, passed on as it is.
        let note = catalog.get("a__agent__note").expect("note");
        assert_eq!(
            note.input_schema,
            *json!({"type": "object"}).as_object().expect("map")
        );
        assert_eq!(
            note.args(json!({"x": 1}).as_object().cloned()),
            Ok(json!({"x": 1}))
        );
    }

    #[test]
    fn names_are_valid_stable_and_unique() {
        let long = "n".repeat(80);
        let nodes = [
            node("weird name/é", "01", verbs()),
            node("weird_name__", "02", verbs()),
            node(&long, "03", verbs()),
        ];
        let catalog = Catalog::build(&nodes, true);
        let mut seen = std::collections::HashSet::new();
        for tool in &catalog.tools {
            assert!(tool.name.len() <= MAX_NAME, "{}", tool.name);
            assert!(
                tool.name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
                "{}",
                tool.name
            );
            assert!(seen.insert(tool.name.clone()), "{} twice", tool.name);
        }
        // "weird name/é" and "weird_name__" both clean to weird_name__:
        // the one sorted second gets a hashed name.
        assert!(catalog.get("weird_name____agent__echo").is_some());
        assert_eq!(catalog, Catalog::build(&nodes, true), "the same every time");
        assert_eq!(catalog.tools.iter().filter(|t| t.node == long).count(), 5);
    }
}
