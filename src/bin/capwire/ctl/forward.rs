//! Handing a command to the `ctl` that owns the state directory, over
//! `ctl.sock` in it: one JSON request line, then one `{"record": ...}`
//! line per record, then `{"exit": CODE, "error": MESSAGE, "reason":
//! ERROR_CODE}` (the reason: capwire's error code, when there is one).
//! Only the long-running commands (`watch`, `top`, a task followed, and
//! `capwire mcp`) serve the socket; a `ctl` that finds the directory held
//! by a one-shot command waits for it to end.
//! A command handed over ends when its client goes away; the owner, when
//! it stops, ends the watches handed to it and lets the other commands
//! finish first.
//!
//! Only the owner of the state directory may use the socket, and three
//! things each make sure of it: the directory is refused unless it is
//! that user's alone (mode 0700, checked on every open); the socket is
//! made mode 0600 whatever the umask (it is bound inside that directory,
//! so nobody else can reach it before); and every connection whose peer
//! credentials (`SO_PEERCRED`) name another uid is answered with a
//! refusal and closed before a byte of it is read. Lines are bounded on
//! both sides while they are read: a request over 64 KiB, or a record
//! line from the owner over 64 MiB (four times the largest record a node
//! sends), ends the connection with a clear error. Requests are bounded
//! in time and number too (5 s to arrive, 32 connections and 8 commands at
//! once).

use std::fs::Permissions;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value as Json, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Ctx, Request};
use crate::exit::{Failure, LOCAL, USAGE};

const SOCKET: &str = "ctl.sock";
/// The longest request line, without its newline.
const MAX_REQUEST: usize = 64 * 1024;
/// The longest line from the owner, without its newline: a record holds
/// a result of up to 16 MiB of CBOR, as JSON.
const MAX_RECORD_LINE: usize = 64 * 1024 * 1024;
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// Commands handed over and running at once.
const MAX_COMMANDS: usize = 8;
/// Connections at once, commands and those still sending their request
/// (or only looking whether an owner answers) together.
const MAX_CONNECTIONS: usize = 32;
/// How long a `ctl` waits for the owner's socket to appear.
const FIND_OWNER: Duration = Duration::from_secs(3);
/// How long a refused connection is drained before it is closed.
const LINGER: Duration = Duration::from_secs(1);
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
    // We hold the state's lock, so socket files left here are stale. The
    // socket is bound under another name, made private, then renamed into
    // place: whoever finds `ctl.sock` finds it private (the directory is
    // the owner's own, checked when the state was opened, so nobody else
    // reached the other name while it had the umask's mode).
    let staged = path.with_extension("sock.new");
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&staged);
    let listener = match UnixListener::bind(&staged) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(
                "cannot serve other ctl processes at {}: {e}",
                path.display()
            );
            return None;
        }
    };
    let placed = std::fs::set_permissions(&staged, Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot make it private: {e}"))
        .and_then(|()| {
            std::fs::rename(&staged, &path).map_err(|e| format!("cannot put it in place: {e}"))
        });
    if let Err(e) = placed {
        tracing::warn!(
            "cannot serve other ctl processes at {}: {e}",
            path.display()
        );
        drop(listener);
        let _ = std::fs::remove_file(&staged);
        return None;
    }
    let owner = rustix::process::geteuid().as_raw();
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
                let permit = Arc::clone(&connections).try_acquire_owned();
                if let Err(refusal) = check_peer(&stream, owner) {
                    tracing::warn!("ctl.sock: {refusal}");
                    if let Ok(permit) = permit {
                        running.spawn(async move {
                            let (read, write) = stream.into_split();
                            end_with(read, write, &end_line(LOCAL, &refusal)).await;
                            drop(permit);
                        });
                    }
                    continue;
                }
                let Ok(permit) = permit else {
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

/// Refuses a connection from any user but `owner`: the message to send.
fn check_peer(stream: &UnixStream, owner: u32) -> Result<(), String> {
    match stream.peer_cred() {
        Ok(cred) if cred.uid() == owner => Ok(()),
        Ok(cred) => Err(format!(
            "refused a connection from uid {}: only uid {owner}, the owner of the state \
             directory, may use this control plane",
            cred.uid()
        )),
        Err(e) => Err(format!(
            "refused a connection whose peer credentials cannot be read: {e}"
        )),
    }
}

/// Ends a connection with `line`: it is sent, no more is, and what the
/// other side still sends is read and dropped (up to [`MAX_REQUEST`]
/// bytes), so that closing with its bytes unread does not reset the
/// connection before it has read the line. [`LINGER`] at most.
async fn end_with(mut read: OwnedReadHalf, mut write: OwnedWriteHalf, line: &str) {
    let end = async {
        write.write_all(line.as_bytes()).await?;
        write.shutdown().await?;
        let mut sink = [0u8; 4096];
        let mut left = MAX_REQUEST;
        while left > 0 {
            match read.read(&mut sink).await? {
                0 => break,
                n => left = left.saturating_sub(n),
            }
        }
        std::io::Result::Ok(())
    };
    let _ = tokio::time::timeout(LINGER, end).await;
}

/// The line that ends a command (or refuses one): an exit code and the
/// message, with its newline.
fn end_line(code: u8, message: &str) -> String {
    format!("{}\n", json!({"exit": code, "error": message}))
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
    end_line(
        LOCAL,
        &format!(
            "the ctl process that owns the state directory is busy with {MAX_COMMANDS} \
             commands; try again"
        ),
    )
}

/// Why a line could not be read, for the other side.
fn line_error(e: &LinesCodecError, max: usize) -> String {
    match e {
        LinesCodecError::MaxLineLengthExceeded => format!("a line longer than {max} bytes"),
        LinesCodecError::Io(e) => e.to_string(),
    }
}

async fn handle(
    ctx: &Ctx,
    stream: UnixStream,
    commands: &Arc<Semaphore>,
    stop: &CancellationToken,
) {
    let (read, mut write) = stream.into_split();
    let mut lines = FramedRead::new(read, LinesCodec::new_with_max_length(MAX_REQUEST));
    let request = match tokio::time::timeout(REQUEST_DEADLINE, lines.next()).await {
        // Connected and gone without a word: a ctl looking for the owner.
        Ok(None) => return,
        Ok(Some(Ok(line))) => serde_json::from_str::<Request>(&line).map_err(|e| e.to_string()),
        Ok(Some(Err(e))) => Err(line_error(&e, MAX_REQUEST)),
        Err(_) => Err("no request in time".into()),
    };
    let request = match request {
        Ok(r) => r,
        Err(e) => {
            let line = end_line(USAGE, &format!("bad request: {e}"));
            end_with(lines.into_inner(), write, &line).await;
            return;
        }
    };
    let Ok(_permit) = Arc::clone(commands).try_acquire_owned() else {
        let _ = write.write_all(busy().as_bytes()).await;
        return;
    };
    // A watch or a stream runs until its client goes (or it ends); this
    // process stopping ends it.
    let long_running = request.command.is_long_running();
    let (tx, mut rx) = mpsc::channel(256);
    let timeout = Duration::from_millis(request.timeout_ms);
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
                // The client sends nothing after its request: any line,
                // error or end means it went away.
                _ = lines.next() => return,
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
        Err(f) => json!({"exit": f.code, "error": f.message, "reason": f.reason}),
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
    receive(read, out).await
}

/// Reads the owner's answer to a request: its records go to `out`, its
/// last line is the outcome.
async fn receive(read: OwnedReadHalf, out: &mpsc::Sender<Json>) -> Result<(), Failure> {
    let mut lines = FramedRead::new(read, LinesCodec::new_with_max_length(MAX_RECORD_LINE));
    loop {
        let line = match lines.next().await {
            Some(Ok(line)) => line,
            Some(Err(LinesCodecError::MaxLineLengthExceeded)) => {
                return Err(Failure::failed(format!(
                    "the ctl process that owns the state directory sent a line longer than \
                     {MAX_RECORD_LINE} bytes; the command's outcome is unknown"
                )));
            }
            // The connection ended.
            Some(Err(LinesCodecError::Io(_))) | None => break,
        };
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
                Ok(code) => {
                    let mut failure =
                        Failure::new(code, msg["error"].as_str().unwrap_or("failed").to_owned());
                    failure.reason = msg["reason"].as_str().map(str::to_owned);
                    Err(failure)
                }
                Err(_) => Err(Failure::new(LOCAL, "bad exit code from the owner")),
            };
        }
    }
    Err(Failure::failed(
        "the process that owns the state directory stopped before answering",
    ))
}
