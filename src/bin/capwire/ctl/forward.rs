//! Handing a command to the `ctl` that owns the state directory, over
//! `ctl.sock` in it: one JSON request line, then one `{"record": ...}`
//! line per record, then `{"exit": CODE, "error": MESSAGE}`.
//!
//! The socket lives in the state directory, which only its owner can
//! enter (mode 0700), so only the owner's processes can use it. Requests
//! are bounded (64 KiB, 5 s to arrive, 8 at once).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value as Json, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Semaphore, mpsc};

use super::{Ctx, Request};
use crate::exit::{Failure, LOCAL};

const SOCKET: &str = "ctl.sock";
const MAX_REQUEST: u64 = 64 * 1024;
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
const MAX_CLIENTS: usize = 8;
/// How long a `ctl` waits for the owner's socket to appear.
const FIND_OWNER: Duration = Duration::from_secs(3);

/// Where the owner of `dir` listens.
pub(crate) fn socket_path(dir: &Path) -> PathBuf {
    dir.join(SOCKET)
}

/// Serves other `ctl` processes while this one runs (best effort: without
/// the socket, they are told the directory is in use).
pub(crate) fn serve(ctx: Arc<Ctx>) {
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
            return;
        }
    };
    let slots = Arc::new(Semaphore::new(MAX_CLIENTS));
    tokio::spawn(async move {
        let _cleanup = RemoveOnDrop(path);
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
                drop(stream);
                continue;
            };
            let ctx = Arc::clone(&ctx);
            tokio::spawn(async move {
                handle(&ctx, stream).await;
                drop(permit);
            });
        }
    });
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn handle(ctx: &Ctx, stream: UnixStream) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(read.take(MAX_REQUEST));
    let request = match tokio::time::timeout(REQUEST_DEADLINE, reader.read_line(&mut line)).await {
        Ok(Ok(_)) => serde_json::from_str::<Request>(&line).map_err(|e| e.to_string()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no request in time".into()),
    };
    let request = match request {
        Ok(r) => r,
        Err(e) => {
            let _ = write
                .write_all(
                    format!(
                        "{}\n",
                        json!({"exit": 2, "error": format!("bad request: {e}")})
                    )
                    .as_bytes(),
                )
                .await;
            return;
        }
    };
    let (tx, mut rx) = mpsc::channel(256);
    let timeout = Duration::from_millis(request.timeout_ms);
    let mut alive = true;
    let result = {
        let run = ctx.exec(request.command, timeout, &tx);
        tokio::pin!(run);
        loop {
            tokio::select! {
                result = &mut run => break result,
                Some(record) = rx.recv(), if alive => {
                    let line = format!("{}\n", json!({"record": record}));
                    // The client went away: stop the command with it.
                    if write.write_all(line.as_bytes()).await.is_err() {
                        alive = false;
                        rx.close();
                    }
                }
            }
        }
    };
    drop(tx);
    while let Some(record) = rx.recv().await {
        let _ = write
            .write_all(format!("{}\n", json!({"record": record})).as_bytes())
            .await;
    }
    let end = match result {
        Ok(()) => json!({"exit": 0}),
        Err(f) => json!({"exit": f.code, "error": f.message}),
    };
    let _ = write.write_all(format!("{end}\n").as_bytes()).await;
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
