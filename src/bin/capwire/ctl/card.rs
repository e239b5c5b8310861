//! A node's A2A Agent Card (A2A 1.0, in its JSON form), made from its
//! manifest with no I/O: `capwire ctl card NODE` prints it and `capwire
//! mcp --http` serves it.
//!
//! ```text
//! book, manifest                   card
//! name in the book                 name (as in the tools' names and the
//!                                  card's path)
//! description                      description
//! app.* capability versions        version (the same while the agent's
//!                                  verbs are; not the manifest's epoch,
//!                                  which starts again with each run)
//! app.* verbs                      skills: id CAP/VERB, name VERB, tags
//!                                  [capwire, CAP, KIND, CLASS], JSON in/out
//! any stream verb                  capabilities.streaming
//! node id, addresses               supportedInterfaces: capwire://ID@ADDR,
//!                                  protocolBinding "capwire",
//!                                  protocolVersion: A2A's, "1.0"
//! schemas, kinds, classes, app id, capabilities.extensions[urn:capwire:verbs:1]
//! own name, wire protocol version
//! ```
//!
//! The card describes; it does not make the node an A2A server: the
//! interface is capwire's own (a Noise XX session, `WIRE.md`), so an A2A
//! client can discover the agent and its skills but must speak capwire
//! (or go through `capwire mcp`) to call them.

use capwire::{Addr, Invite, NodeId};
use serde_json::{Map, Value as Json, json};

/// The extension whose params carry each skill's capwire verb: its kind,
/// class and schemas.
pub(crate) const VERBS_EXTENSION: &str = "urn:capwire:verbs:1";

/// The `protocolBinding` of a capwire interface.
pub(crate) const BINDING: &str = "capwire";

/// The version of A2A the card follows: an interface's `protocolVersion`.
pub(crate) const A2A_VERSION: &str = "1.0";

/// The card's `version` of a node without an `app.*` capability.
const NO_APP_VERSION: &str = "0.0.0";

/// The card of the node whose `manifest` record (`ctl manifest --json`)
/// is given, known as `name` (its name in the control plane's book; the
/// node's own name when empty), reachable at `addrs` (as the book has
/// them: `tcp://HOST:PORT`, `unix:PATH`).
pub(crate) fn card_json(name: &str, manifest: &Json, addrs: &[String]) -> Json {
    let node_id = manifest["node_id"].as_str().unwrap_or_default();
    let own_name = manifest["name"].as_str().unwrap_or_default();
    let name = if name.is_empty() { own_name } else { name };
    let description = match manifest["description"].as_str() {
        Some(d) if !d.is_empty() => d.to_owned(),
        _ => format!("The capwire node {name}."),
    };
    let mut skills = Vec::new();
    let mut verbs = Map::new();
    let mut streaming = false;
    for (cap, cap_id, verb, verb_name) in app_verbs(manifest) {
        let kind = verb["kind"].as_str().unwrap_or("request");
        let class = verb["class"].as_str().unwrap_or("controller");
        streaming |= kind == "stream";
        let id = format!("{cap_id}/{verb_name}");
        let who = if class == "controller" {
            "only the node's control plane may call it"
        } else {
            "any peer may call it"
        };
        skills.push(json!({
            "id": id,
            "name": verb_name,
            "description": format!("{id}: a {kind} verb of {name} ({class}: {who})."),
            "tags": ["capwire", cap_id, kind, class],
            "inputModes": ["application/json"],
            "outputModes": ["application/json"],
        }));
        verbs.insert(
            id,
            json!({
                "cap": cap_id, "capVersion": cap["version"], "verb": verb_name,
                "kind": kind, "class": class,
                "argsSchema": verb["args_schema"],
                "resultSchema": verb["result_schema"],
            }),
        );
    }
    // Each address as an invite without a code: what `capwire ctl` and
    // `Node::connect` take.
    let id: Option<NodeId> = node_id.parse().ok();
    let interfaces: Vec<Json> = addrs
        .iter()
        .filter_map(|addr| {
            let addr: Addr = addr.parse().ok()?;
            let invite = Invite {
                node_id: id?,
                addrs: vec![addr],
                code: None,
            };
            Some(json!({
                "url": invite.to_string(),
                "protocolBinding": BINDING,
                "protocolVersion": A2A_VERSION,
            }))
        })
        .collect();
    json!({
        "name": name,
        "description": description,
        "supportedInterfaces": interfaces,
        "version": agent_version(manifest),
        "capabilities": {
            "streaming": streaming,
            "pushNotifications": false,
            "extensions": [{
                "uri": VERBS_EXTENSION,
                "description": "The capwire node: its key, application id, own name and the \
                    highest version of capwire's wire protocol it speaks (WIRE.md); and each \
                    skill's capwire verb: kind, class (bootstrap or controller), and the JSON \
                    Schemas of its args and result (of one item, for a stream). Args and \
                    results are JSON as capwire ctl call maps it to CBOR.",
                "required": false,
                "params": {
                    "nodeId": node_id,
                    "appId": manifest["app_id"].as_str().unwrap_or_default(),
                    "nodeName": own_name,
                    "wireVersion": wire_version(manifest),
                    "verbs": verbs,
                },
            }],
        },
        "defaultInputModes": ["application/json"],
        "defaultOutputModes": ["application/json"],
        "skills": skills,
    })
}

/// The agent's version: that of its `app.*` capability, or with several,
/// each as `CAP@VERSION`, in the manifest's order, joined by spaces. It
/// stays the same while the agent's verbs do, whatever its restarts.
fn agent_version(manifest: &Json) -> String {
    let caps = manifest["capabilities"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let apps: Vec<(&str, &str)> = caps
        .iter()
        .filter_map(|cap| {
            let id = cap["id"].as_str().filter(|id| id.starts_with("app."))?;
            Some((id, cap["version"].as_str().unwrap_or(NO_APP_VERSION)))
        })
        .collect();
    match apps.as_slice() {
        [] => NO_APP_VERSION.to_owned(),
        [(_, version)] => (*version).to_owned(),
        several => several
            .iter()
            .map(|(id, version)| format!("{id}@{version}"))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// The highest capwire wire protocol version the node speaks: the major
/// version of its `core.protocol` capability, 1 without one (WIRE.md
/// 3.5).
fn wire_version(manifest: &Json) -> u64 {
    let caps = manifest["capabilities"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    caps.iter()
        .find(|cap| cap["id"] == "core.protocol")
        .and_then(|cap| cap["version"].as_str())
        .and_then(|v| v.split('.').next()?.parse().ok())
        .unwrap_or(1)
}

/// Every verb of the `app.*` capabilities of a `manifest` record, with its
/// capability: `(capability, its id, verb, its name)`.
pub(crate) fn app_verbs(manifest: &Json) -> impl Iterator<Item = (&Json, &str, &Json, &str)> {
    let caps = manifest["capabilities"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    caps.iter()
        .filter_map(|cap| {
            let id = cap["id"].as_str().filter(|id| id.starts_with("app."))?;
            Some((cap, id))
        })
        .flat_map(|(cap, id)| {
            let verbs = cap["verbs"].as_array().map_or(&[][..], Vec::as_slice);
            verbs
                .iter()
                .filter_map(move |verb| Some((cap, id, verb, verb["name"].as_str()?)))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skills_interfaces_and_schemas() {
        let manifest = json!({
            "kind": "manifest", "node_id": "ab".repeat(32), "name": "agent-1", "description": "",
            "epoch": 7,
            "capabilities": [
                {"id": "core.monitoring", "version": "1.0.0", "verbs": [
                    {"name": "status", "kind": "request", "class": "bootstrap",
                     "args_schema": null, "result_schema": null}]},
                {"id": "app.agent", "version": "1.2.0", "verbs": [
                    {"name": "echo", "kind": "request", "class": "bootstrap",
                     "args_schema": {"type": "string"}, "result_schema": null},
                    {"name": "tell", "kind": "stream", "class": "controller",
                     "args_schema": null, "result_schema": {"type": "string"}}]},
            ],
        });
        let card = card_json("agent-one", &manifest, &["tcp://127.0.0.1:7000".into()]);
        // The name the control plane knows it by; its own in the extension.
        assert_eq!(card["name"], "agent-one");
        assert_eq!(card["description"], "The capwire node agent-one.");
        // The app capability's version, not the epoch.
        assert_eq!(card["version"], "1.2.0");
        assert_eq!(card["supportedInterfaces"][0]["protocolVersion"], "1.0");
        let params = &card["capabilities"]["extensions"][0]["params"];
        assert_eq!(params["nodeName"], "agent-1");
        assert_eq!(params["wireVersion"], 1, "no core.protocol: version 1 only");
        assert_eq!(card["capabilities"]["streaming"], true);
        assert_eq!(
            card["supportedInterfaces"][0]["url"],
            format!("capwire://{}@127.0.0.1:7000", "ab".repeat(32))
        );
        let skills = card["skills"].as_array().expect("skills");
        assert_eq!(skills.len(), 2, "core verbs are not skills");
        assert_eq!(skills[0]["id"], "app.agent/echo");
        assert_eq!(skills[1]["tags"][3], "controller");
        let verbs = &card["capabilities"]["extensions"][0]["params"]["verbs"];
        assert_eq!(verbs["app.agent/echo"]["argsSchema"]["type"], "string");
        assert_eq!(verbs["app.agent/tell"]["resultSchema"]["type"], "string");
        // No name in the book: the node's own.
        let card = card_json("", &manifest, &[]);
        assert_eq!(card["name"], "agent-1");
    }

    #[test]
    fn version_and_wire_version() {
        let cap = |id: &str, version: &str| {
            json!({"id": id, "version": version, "verbs": [
                {"name": "v", "kind": "request", "class": "bootstrap",
                 "args_schema": null, "result_schema": null}]})
        };
        let manifest = |caps: Vec<Json>, epoch: u64| {
            json!({"kind": "manifest", "node_id": "ab".repeat(32), "app_id": "my.app",
                   "name": "a", "description": "d", "epoch": epoch, "capabilities": caps})
        };
        let two = vec![
            cap("core.protocol", "2.0.0"),
            cap("app.b", "0.3.1"),
            cap("app.a", "1.0.0"),
        ];
        let card = card_json("a", &manifest(two.clone(), 3), &[]);
        assert_eq!(card["version"], "app.b@0.3.1 app.a@1.0.0");
        assert_eq!(
            card_json("a", &manifest(two, 1), &[])["version"],
            card["version"],
            "a restart (a new epoch) is the same version"
        );
        let params = &card["capabilities"]["extensions"][0]["params"];
        assert_eq!(params["wireVersion"], 2);
        assert_eq!(params["appId"], "my.app");
        let none = card_json("a", &manifest(vec![cap("core.protocol", "2.0.0")], 1), &[]);
        assert_eq!(none["version"], "0.0.0");
    }
}
