//! A stream verb between two nodes: the handler produces faster than the
//! caller consumes, and the caller's credit (a window of 8 items here)
//! holds it back; then a stream dropped halfway is cancelled at the server.
use std::time::Duration;

use capwire::manifest::verb;
use capwire::{Capability, HandlerError, Items, Limits, Node};

verb! {
    /** Counts from 1 to the number asked for, one item each. */
    pub struct Count: stream "app.count" / "up", Bootstrap, u32 => u32;
}

async fn up(to: u32, mut numbers: Items<u32>) -> Result<(), HandlerError> {
    for n in 1..=to {
        // Waits whenever the caller has no room for one more.
        numbers.send(n).await?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = Node::builder("counter")
        .listen("127.0.0.1:0".parse()?)
        .capability(Capability::new("app.count", "1.0.0")?.stream(Count, up))
        .start()
        .await?;
    let client = Node::builder("reader")
        .limits(Limits {
            stream_window_items: 8,
            ..Limits::default()
        })
        .start()
        .await?;
    let peer = client
        .connect(&server.local_addrs()[0], Some(server.id()))
        .await?;

    // A slow consumer: the producer waits for credit instead of piling up.
    let mut numbers = peer.stream(Count, 40).await?;
    let mut most = 0;
    while let Some(n) = numbers.next().await {
        let n = n?;
        tokio::time::sleep(Duration::from_millis(5)).await;
        most = most.max(numbers.buffered());
        if n % 10 == 0 {
            println!("took {n}; {} more arrived and wait", numbers.buffered());
        }
    }
    let stats = server.stats();
    println!(
        "40 items; never more than {most} waiting (window 8); the handler waited for credit {} times",
        stats.stream_credit_stalls
    );

    // Dropping the stream cancels it: the server's handler stops.
    let mut numbers = peer.stream(Count, 1_000_000).await?;
    for _ in 0..3 {
        numbers.next().await.transpose()?;
    }
    println!(
        "serving {} stream(s); dropping it",
        server.stats().streams_served
    );
    drop(numbers);
    while server.stats().streams_served > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!("serving {} stream(s)", server.stats().streams_served);

    client.shutdown().await;
    server.shutdown().await;
    Ok(())
}
