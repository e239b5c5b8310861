//! `capwire acp` driven by the `agent-client-protocol` crate's own client
//! (it spawns the agent process): a node made here serves a task verb
//! whose question is a choice, answered through
//! `session/request_permission`; one whose question is free, answered
//! through `elicitation/create` when the client offers forms (and left to
//! `capwire ctl tasks` when it does not); and a controller task verb,
//! which the face fronts only with `--allow-controller`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli_support;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    ClientCapabilities, ContentBlock, CreateElicitationRequest, CreateElicitationResponse,
    ElicitationAcceptAction, ElicitationAction, ElicitationCapabilities, ElicitationContentValue,
    ElicitationFormCapabilities, InitializeRequest, NewSessionRequest, PromptRequest,
    RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse,
    SelectedPermissionOutcome, SessionNotification, SessionUpdate, StopReason, TextContent,
};
use agent_client_protocol::{AcpAgent, Agent, Client};
use capwire::manifest::verb;
use capwire::task::Task;
use capwire::{Capability, HandlerError, Node};
use cli_support::{BIN, assert_fails, capwire, ctl_ok, run_cmd, tempdir};
use serde_json::json;

/// Args of both verbs.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, capwire::JsonSchema)]
#[schemars(crate = "capwire::schemars")]
struct Ask {
    text: String,
}

verb! {
    /// Asks which colour, answers the pick.
    struct Pick: task "app.ops" / "pick", Bootstrap, Ask => String;
}
verb! {
    /// Asks a free question (no choices), answers with it.
    struct Name: task "app.ops" / "name", Bootstrap, Ask => String;
}
verb! {
    /// Deploys: for the controller only.
    struct Deploy: task "app.ops" / "deploy", Controller, Ask => String;
}

async fn pick(args: Ask, task: Task) -> Result<String, HandlerError> {
    task.progress(&json!({"read": args.text})).await?;
    let question = json!({"question": "which colour?", "choices": ["blue", "green"]});
    let answer: String = task.ask(&question, Duration::from_secs(60)).await?;
    Ok(format!("{}: {answer}", args.text))
}

async fn name(args: Ask, task: Task) -> Result<String, HandlerError> {
    let question = json!({"field": "name", "why": args.text});
    let answer: serde_json::Value = task.ask(&question, Duration::from_secs(60)).await?;
    Ok(format!("named {answer}"))
}

async fn deploy(args: Ask, _task: Task) -> Result<String, HandlerError> {
    Ok(format!("deployed {}", args.text))
}

/// A node serving both verbs, bound by a control plane whose state is
/// `cp`.
async fn bound_node(cp: &Path) -> Node {
    let node = Node::builder("ops")
        .listen("127.0.0.1:0".parse().unwrap())
        .capability(
            Capability::new("app.ops", "1.0.0")
                .unwrap()
                .task(Pick, pick)
                .task(Name, name)
                .task(Deploy, deploy),
        )
        .start()
        .await
        .unwrap();
    let invite = node.invite(None).unwrap().to_string();
    let cp = cp.to_owned();
    tokio::task::spawn_blocking(move || ctl_ok(&cp, &["bind", &invite, "--name", "ops"]))
        .await
        .unwrap();
    node
}

/// What the editor saw.
#[derive(Default)]
struct Seen {
    updates: Vec<SessionUpdate>,
    asked: Vec<RequestPermissionRequest>,
    forms: Vec<CreateElicitationRequest>,
}

/// Runs one prompt through `capwire acp ARGS` with the crate's client,
/// choosing the permission option named `choose`; with `forms`, the
/// client offers forms and fills each with `choose`.
async fn prompt_once(
    args: Vec<String>,
    text: &str,
    choose: &str,
    forms: bool,
) -> (StopReason, Seen) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let config = json!({ "command": BIN, "args": args, "env": {"NO_COLOR": "1"} });
    let agent: AcpAgent = config.to_string().parse().unwrap();
    let (on_update, on_ask, on_form) = (Arc::clone(&seen), Arc::clone(&seen), Arc::clone(&seen));
    let fill = choose.to_owned();
    let choose = choose.to_owned();
    let text = text.to_owned();
    let stop = Client
        .v1()
        .on_receive_notification(
            async move |n: SessionNotification, _cx| {
                on_update.lock().unwrap().updates.push(n.update);
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: RequestPermissionRequest, responder, _cx| {
                let option = request
                    .options
                    .iter()
                    .find(|o| o.name == choose)
                    .map(|o| o.option_id.clone());
                on_ask.lock().unwrap().asked.push(request);
                let outcome = match option {
                    Some(id) => {
                        RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(id))
                    }
                    None => RequestPermissionOutcome::Cancelled,
                };
                responder.respond(RequestPermissionResponse::new(outcome))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: CreateElicitationRequest, responder, _cx| {
                on_form.lock().unwrap().forms.push(request);
                let content = [(
                    "answer".to_owned(),
                    ElicitationContentValue::String(fill.clone()),
                )];
                let accept = ElicitationAcceptAction::new().content(
                    content
                        .into_iter()
                        .collect::<std::collections::BTreeMap<_, _>>(),
                );
                responder.respond(CreateElicitationResponse::new(ElicitationAction::Accept(
                    accept,
                )))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_with(agent, async move |cx: ConnectionTo<Agent>| {
            let mut caps = ClientCapabilities::new();
            if forms {
                caps = caps.elicitation(
                    ElicitationCapabilities::new().form(ElicitationFormCapabilities::new()),
                );
            }
            let init = cx
                .send_request(InitializeRequest::new(ProtocolVersion::V1).client_capabilities(caps))
                .block_task()
                .await?;
            assert!(init.agent_capabilities.load_session);
            let session = cx
                .send_request(NewSessionRequest::new(PathBuf::from("/")))
                .block_task()
                .await?;
            let done = cx
                .send_request(PromptRequest::new(
                    session.session_id,
                    vec![ContentBlock::Text(TextContent::new(text))],
                ))
                .block_task()
                .await?;
            Ok(done.stop_reason)
        });
    let stop = tokio::time::timeout(Duration::from_secs(60), stop)
        .await
        .expect("the prompt turn took over 60 s")
        .unwrap();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    (stop, seen)
}

fn said(seen: &Seen) -> Vec<String> {
    seen.updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::AgentMessageChunk(c) => match &c.content {
                ContentBlock::Text(t) => Some(t.text.clone()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crate_s_client_runs_turns_with_a_choice_a_form_and_a_controller_verb_behind_its_flag()
{
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let node = bound_node(&cp).await;
    let state = cp.to_str().unwrap().to_owned();
    let acp = |verb: &str, extra: &[&str]| {
        let mut args = vec!["acp".to_owned(), "--state".into(), state.clone()];
        args.extend(["--verb".to_owned(), verb.to_owned()]);
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args
    };

    // A choice question, as a permission request with the choices.
    let (stop, seen) = prompt_once(acp("app.ops/pick", &[]), "paint", "green", false).await;
    assert_eq!(stop, StopReason::EndTurn);
    assert_eq!(said(&seen), vec!["paint: green".to_owned()]);
    let [asked] = seen.asked.as_slice() else {
        panic!("asked {} times", seen.asked.len());
    };
    let names: Vec<&str> = asked.options.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["blue", "green"]);
    assert_eq!(
        asked.tool_call.fields.title.as_deref(),
        Some("which colour?")
    );
    assert!(matches!(seen.updates[0], SessionUpdate::ToolCall(_)));

    // A controller verb: refused at the start without the flag.
    let state2 = state.clone();
    let refused = tokio::task::spawn_blocking(move || {
        let mut cmd = capwire();
        cmd.args(["acp", "--state", &state2, "--verb", "app.ops/deploy"]);
        run_cmd(cmd, "capwire acp")
    })
    .await
    .unwrap();
    let message = assert_fails(&refused, 2, "--allow-controller");
    assert!(message.contains("controller verb"), "{message}");

    // With it, the bound control plane deploys.
    let (stop, seen) = prompt_once(
        acp("app.ops/deploy", &["--allow-controller"]),
        "v2",
        "none",
        false,
    )
    .await;
    assert_eq!(stop, StopReason::EndTurn);
    assert_eq!(said(&seen), vec!["deployed v2".to_owned()]);

    // A question that is no choice: a form for a client that offers
    // forms (its text sent as JSON when it is JSON)...
    let (stop, seen) = prompt_once(acp("app.ops/name", &[]), "ship", "\"Ada\"", true).await;
    assert_eq!(stop, StopReason::EndTurn);
    assert_eq!(said(&seen), vec!["named \"Ada\"".to_owned()]);
    let [form] = seen.forms.as_slice() else {
        panic!("{} forms", seen.forms.len());
    };
    assert!(
        form.message.contains("\"field\":\"name\""),
        "{}",
        form.message
    );
    assert!(seen.asked.is_empty());
    // ...and for one that does not, the turn ends and says how to answer.
    let (stop, seen) = prompt_once(acp("app.ops/name", &[]), "ship", "x", false).await;
    assert_eq!(stop, StopReason::EndTurn);
    assert!(seen.forms.is_empty() && seen.asked.is_empty());
    let told = said(&seen).join("");
    assert!(told.contains("capwire ctl tasks ops respond"), "{told}");
    node.shutdown().await;
}
