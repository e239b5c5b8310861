//! Two nodes, an `app.echo` capability, one request and one notification.
use capwire::manifest::verb;
use capwire::{Capability, HandlerError, Node, Sender};

verb! { /** Echoes text back. */ pub struct Say: request "app.echo" / "say", Bootstrap, String => String; }
verb! { /** A fire-and-forget note. */ pub struct Note: notification "app.echo" / "note", Bootstrap, String; }

async fn say(text: String, Sender(from): Sender) -> Result<String, HandlerError> {
    Ok(format!("{text} (heard from {from})"))
}

async fn note(text: String) -> Result<(), HandlerError> {
    println!("server got a notification: {text}");
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let echo = Capability::new("app.echo", "1.0.0")?
        .handle(Say, say)
        .handle(Note, note);
    let server = Node::builder("echo-server")
        .listen("127.0.0.1:0".parse()?)
        .capability(echo)
        .start()
        .await?;
    let client = Node::builder("echo-client").start().await?;

    let peer = client
        .connect(&server.local_addrs()[0], Some(server.id()))
        .await?;
    peer.require(&"app.echo@^1".parse()?)?;
    println!("reply: {}", peer.request(Say, "hello".into()).await?);
    peer.notify(Note, "fire and forget".into()).await?;

    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    client.shutdown().await;
    server.shutdown().await;
    Ok(())
}
