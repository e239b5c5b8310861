//! A task verb between two nodes: the worker's handler reports progress
//! and asks a question; the caller submits, watches the events as they
//! are written, answers the question and gets the result. The task runs
//! on the worker, durably: the caller could go away and find it again by
//! its id (`Peer::task`).
use std::time::Duration;

use capwire::manifest::{TaskEventKind, TaskState, verb};
use capwire::{Capability, HandlerError, JsonSchema, Node, Task};
use serde::{Deserialize, Serialize};

/// What to build.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "capwire::schemars")]
struct Build {
    name: String,
    parts: u32,
}

verb! {
    /// Builds the parts one by one, after asking which version to build.
    struct BuildIt: task "app.build" / "build", Bootstrap, Build => String;
}

async fn build(args: Build, task: Task) -> Result<String, HandlerError> {
    let question = format!("which version of {}?", args.name);
    // input_required until the answer comes (core.tasks/respond).
    let version: String = task.ask(&question, Duration::from_secs(60)).await?;
    for part in 1..=args.parts {
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Written durably before it returns.
        task.progress(&format!("part {part} of {}", args.parts))
            .await?;
    }
    Ok(format!(
        "{} {version}: {} parts built",
        args.name, args.parts
    ))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let worker = Node::builder("worker")
        .listen("127.0.0.1:0".parse()?)
        .capability(Capability::new("app.build", "1.0.0")?.task(BuildIt, build))
        .start()
        .await?;
    let client = Node::builder("client").start().await?;
    let peer = client
        .connect(&worker.local_addrs()[0], Some(worker.id()))
        .await?;

    // The answer is the task's id, as soon as the task is written.
    let args = Build {
        name: "site".into(),
        parts: 3,
    };
    let task = peer.submit(BuildIt, args).await?;
    println!("submitted task {}", task.id());

    // Every event, from the first, then each new one until the last.
    let mut events = task.events(1).await?;
    while let Some(event) = events.next().await {
        let event = event?;
        let body = if event.body.is_null() {
            String::new()
        } else {
            capwire::json::cbor_to_json(&event.body)?.to_string()
        };
        let kind = format!("{:?}", event.kind);
        let state = event.state.as_str();
        let line = format!("#{} {state:<14} {kind:<8} {body}", event.seq);
        println!("{}", line.trim_end());
        if event.kind == TaskEventKind::Question && event.state == TaskState::InputRequired {
            let info = task.respond(&"v2").await?;
            println!("   answered \"v2\": the task is {} again", info.state);
        }
    }
    println!("result: {}", task.result().await?);

    client.shutdown().await;
    worker.shutdown().await;
    Ok(())
}
