//! Handing a command to the `ctl` that owns the state directory, over
//! `ctl.sock` in it: one JSON request line, then one `{"record": ...}`
//! line per record, then `{"exit": CODE, "error": MESSAGE}`. Only the
//! long-running commands (`watch`, `top`) serve the socket; a `ctl` that
//! finds the directory held by a one-shot command waits for it to end.
//! A command handed over ends when its client goes away; the owner, when
//! it stops, ends the watches handed to it and lets the other commands
//! finish first.
//!
//! The socket lives in the state directory, which only its owner can
//! enter (mode 0700), so only the owner's processes can use it. Requests
//! are bounded (64 KiB, 5 s to arrive, 32 connections and 8 commands at
//! once).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value as Json, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{CtlCommand, Ctx, Request};
use crate::exit::{Failure, LOCAL, USAGE};

const SOCKET: &str = "ctl.sock";
const MAX_REQUEST: u64 = 64 * 1024;
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// Commands handed over and running at once.
const MAX_COMMANDS: usize = 8;
/// Connections at once, commands and those still sending their request
/// (or only looking whether an owner answers) together.
const MAX_CONNECTIONS: usize = 32;
/// How long a `ctl` waits for the owner's socket to appear.
const FIND_OWNER: Duration = Duration::from_secs(3);
/// The pause after a failed accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Where the owner of `dir` listens.
pub(crate) fn socket_path(dir: &Path) -> PathBuf {
    dir.join(SOCKET)
}

/// The socket server of a `ctl` that owns the state directory.
pub(crate) struct Server {
    accept: JoinHandle<()>,
    running: TaskTracker,
    stop: CancellationToken,
}

/// Serves other `ctl` processes while this one runs (best effort: without
/// the socket, they wait for the state directory to be free).
pub(crate) fn serve(ctx: Arc<Ctx>) -> Option<Server> {
    let path = socket_path(ctx.dir());
    // We hold the state's lock, so a socket file left here is stale.
    let _ = std::fs::remove_file(&path);
    let listener = match UnixListener::bind(&path) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(
                "cannot serve other ctl processes at {}: {e}",
                path.display()
            );
            return None;
        }
    };
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let commands = Arc::new(Semaphore::new(MAX_COMMANDS));
    let running = TaskTracker::new();
    let stop = CancellationToken::new();
    let accept = {
        let running = running.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let _cleanup = RemoveOnDrop(path);
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of descriptors, say: try again in a while.
                        tracing::debug!("ctl.sock accept: {e}");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                };
                let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
                    let _ = stream.try_write(busy().as_bytes());
                    continue;
                };
                let ctx = Arc::clone(&ctx);
                let stop = stop.clone();
                let commands = Arc::clone(&commands);
                running.spawn(async move {
                    handle(&ctx, stream, &commands, &stop).await;
                    drop(permit);
                });
            }
        })
    };
    Some(Server {
        accept,
        running,
        stop,
    })
}

impl Server {
    /// Stops taking commands (the socket goes), ends the watches handed
    /// over, and waits up to `grace` for the other commands to finish.
    pub(crate) async fn close(self, grace: Duration) {
        self.accept.abort();
        let _ = self.accept.await;
        self.stop.cancel();
        self.running.close();
        if tokio::time::timeout(grace, self.running.wait())
            .await
            .is_err()
        {
            tracing::warn!("commands handed over by other ctl processes did not finish in time");
        }
    }
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn write_line(write: &mut OwnedWriteHalf, msg: &Json) -> std::io::Result<()> {
    write.write_all(format!("{msg}\n").as_bytes()).await
}

/// The answer when there are too many connections or commands (one line,
/// with its newline).
fn busy() -> String {
    let msg = json!({"exit": LOCAL, "error": format!(
        "the ctl process that owns the state directory is busy with {MAX_COMMANDS} \
         commands; try again"
    )});
    format!("{msg}\n")
}

async fn handle(
    ctx: &Ctx,
    stream: UnixStream,
    commands: &Arc<Semaphore>,
    stop: &CancellationToken,
) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(read.take(MAX_REQUEST));
    let request = match tokio::time::timeout(REQUEST_DEADLINE, reader.read_line(&mut line)).await {
        // Connected and gone without a word: a ctl looking for the owner.
        Ok(Ok(0)) => return,
        Ok(Ok(_)) => serde_json::from_str::<Request>(&line).map_err(|e| e.to_string()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no request in time".into()),
    };
    let request = match request {
        Ok(r) => r,
        Err(e) => {
            let msg = json!({"exit": USAGE, "error": format!("bad request: {e}")});
            let _ = write_line(&mut write, &msg).await;
            return;
        }
    };
    let Ok(_permit) = Arc::clone(commands).try_acquire_owned() else {
        let _ = write.write_all(busy().as_bytes()).await;
        return;
    };
    // A watch runs until its client goes; this process stopping ends it.
    let long_running = matches!(request.command, CtlCommand::Watch);
    let (tx, mut rx) = mpsc::channel(256);
    let timeout = Duration::from_millis(request.timeout_ms);
    let mut eof = [0u8; 1];
    let result = {
        let run = ctx.exec(request.command, timeout, &tx);
        tokio::pin!(run);
        loop {
            tokio::select! {
                result = &mut run => break result,
                Some(record) = rx.recv() => {
                    // The client went away: stop the command with it.
                    if write_line(&mut write, &json!({"record": record})).await.is_err() {
                        return;
                    }
                }
                // The client sends nothing after its request: any read
                // ending means it went away.
                _ = reader.read(&mut eof) => return,
                () = stop.cancelled(), if long_running => {
                    break Err(Failure::failed(
                        "the ctl process that owned the state directory stopped",
                    ));
                }
            }
        }
    };
    drop(tx);
    while let Some(record) = rx.recv().await {
        if write_line(&mut write, &json!({"record": record}))
            .await
            .is_err()
        {
            return;
        }
    }
    let end = match result {
        Ok(()) => json!({"exit": 0}),
        Err(f) => json!({"exit": f.code, "error": f.message}),
    };
    let _ = write_line(&mut write, &end).await;
}

/// Sends `request` to the owner at `socket`; its records go to `out`.
pub(crate) async fn send(
    socket: &Path,
    request: &Request,
    out: &mpsc::Sender<Json>,
) -> Result<(), Failure> {
    let in_use = || {
        Failure::failed(format!(
            "the control plane's state directory is in use by another process that does not \
             answer at {}",
            socket.display()
        ))
    };
    let started = tokio::time::Instant::now();
    let stream = loop {
        match UnixStream::connect(socket).await {
            Ok(s) => break s,
            Err(_) if started.elapsed() < FIND_OWNER => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(_) => return Err(in_use()),
        }
    };
    let (read, mut write) = stream.into_split();
    let line = serde_json::to_string(request).map_err(|e| Failure::failed(e.to_string()))?;
    write
        .write_all(format!("{line}\n").as_bytes())
        .await
        .map_err(|_| in_use())?;
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(mut msg) = serde_json::from_str::<Json>(&line) else {
            continue;
        };
        if let Some(record) = msg.get_mut("record") {
            if out.send(record.take()).await.is_err() {
                return Ok(());
            }
        } else if let Some(code) = msg.get("exit").and_then(Json::as_u64) {
            return match u8::try_from(code) {
                Ok(0) => Ok(()),
                Ok(code) => Err(Failure::new(
                    code,
                    msg["error"].as_str().unwrap_or("failed").to_owned(),
                )),
                Err(_) => Err(Failure::new(LOCAL, "bad exit code from the owner")),
            };
        }
    }
    Err(Failure::failed(
        "the process that owns the state directory stopped before answering",
    ))
}
