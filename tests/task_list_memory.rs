//! `core.tasks/list` reads the tasks of a page a few at a time and stops
//! where the answer is full: what one list costs in memory is bounded by
//! the caller's frame, not by `limit` times the largest task (200 tasks
//! with two bodies of 60 KB each would be 24 MB, read, and as much again
//! encoded). Measured with a counting global allocator; this file holds a
//! single test so that nothing else allocates while it measures.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::alloc::System;

use capwire::manifest::{ListTasksArgs, TasksList, verb};
use capwire::{Capability, HandlerError, Node, Task, TransportConfig};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

verb! {
    /// Reports one large progress and ends with a large result.
    pub struct Big: task "app.big" / "make", Bootstrap, u32 => String;
}

async fn make(n: u32, task: Task) -> Result<String, HandlerError> {
    task.progress(&"p".repeat(60_000)).await?;
    Ok(format!("{n}{}", "r".repeat(60_000)))
}

#[tokio::test(flavor = "current_thread")]
async fn a_page_of_large_tasks_costs_about_one_frame() {
    let node = Node::builder("big")
        .listen("127.0.0.1:0".parse().unwrap())
        .capability(Capability::new("app.big", "1.0.0").unwrap().task(Big, make))
        .start()
        .await
        .unwrap();
    // A caller that takes records of at most 1 MiB.
    let mut small = TransportConfig::default();
    small.max_record_size = 1 << 20;
    let client = Node::builder("client")
        .transport_config(small)
        .start()
        .await
        .unwrap();
    let peer = client
        .connect(&node.local_addrs()[0], Some(node.id()))
        .await
        .unwrap();
    for n in 0..200 {
        let t = peer.submit(Big, n).await.unwrap();
        t.result().await.unwrap();
    }
    let all = ListTasksArgs {
        limit: Some(200),
        ..ListTasksArgs::default()
    };
    // Warm up: buffers reach their steady sizes.
    peer.request(TasksList, all.clone()).await.unwrap();

    let region = Region::new(GLOBAL);
    let page = peer.request(TasksList, all).await.unwrap();
    let allocated = region.change().bytes_allocated;
    println!(
        "a page of {} tasks: {} KiB allocated",
        page.tasks.len(),
        allocated / 1024
    );
    assert!(
        (5..=8).contains(&page.tasks.len()),
        "{} tasks fit in 1 MiB",
        page.tasks.len()
    );
    assert!(page.next.is_some());
    assert!(
        allocated < 20 << 20,
        "{} MiB allocated for one page of about 1 MiB",
        allocated >> 20
    );
    client.shutdown().await;
    node.shutdown().await;
}
