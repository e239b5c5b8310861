//! The stream of a connection, split: the reading half belongs to the
//! driver; the writing half is shared by the driver and callers.
//!
//! The driver reads and writes through `poll_*`. Callers may also try a
//! write that never waits ([`Writer::try_write`]): when the writer is
//! idle, a request reaches the socket from the caller's own task, with no
//! hand-off at all. TCP and Unix sockets can do that; any other stream (an
//! in-memory pair, a simulated network) is written only by its driver.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
#[cfg(unix)]
use tokio::net::UnixStream;

/// The reading half, owned by the driver.
pub(crate) trait Reader: Send + 'static {
    /// Reads into the spare capacity of `buf`; `Ok(0)` is the end of the
    /// stream.
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>>;
}

/// The writing half, shared.
pub(crate) trait Writer: Send + Sync + 'static {
    /// Writes some of `buf`.
    fn poll_write(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>>;
    /// Writes what it can of `buf` now, from any task (0 when the stream
    /// takes nothing now); `None` when this stream cannot be written from
    /// outside its driver.
    fn try_write(&self, buf: &[u8]) -> Option<io::Result<usize>>;
    /// Flushes buffered bytes.
    fn poll_flush(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
    /// Shuts down the writing side.
    fn poll_shutdown(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
}

struct Half<R>(R);

impl<R: AsyncRead + Unpin + Send + 'static> Reader for Half<R> {
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        tokio_util::io::poll_read_buf(Pin::new(&mut self.0), cx, buf)
    }
}

macro_rules! socket_writer {
    ($name:ident, $half:ty) => {
        /// A socket's writing half: readiness-based, writable from any task.
        struct $name($half);

        impl Writer for $name {
            fn poll_write(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
                loop {
                    if let Err(e) = std::task::ready!(self.0.as_ref().poll_write_ready(cx)) {
                        return Poll::Ready(Err(e));
                    }
                    match self.0.try_write(buf) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        r => return Poll::Ready(r),
                    }
                }
            }

            fn try_write(&self, buf: &[u8]) -> Option<io::Result<usize>> {
                Some(match self.0.try_write(buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
                    r => r,
                })
            }

            fn poll_flush(&self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Poll::Ready(Ok(()))
            }

            fn poll_shutdown(&self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Poll::Ready(
                    socket2::SockRef::from(self.0.as_ref()).shutdown(std::net::Shutdown::Write),
                )
            }
        }
    };
}

socket_writer!(TcpWriter, tokio::net::tcp::OwnedWriteHalf);
#[cfg(unix)]
socket_writer!(UnixWriter, tokio::net::unix::OwnedWriteHalf);

/// Any other stream's writing half, written only by its driver.
struct StreamWriter<S>(Mutex<WriteHalf<S>>);

impl<S: AsyncRead + AsyncWrite + Send + 'static> StreamWriter<S> {
    fn with<T>(&self, f: impl FnOnce(Pin<&mut WriteHalf<S>>) -> T) -> T {
        let mut half = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        f(Pin::new(&mut *half))
    }
}

impl<S: AsyncRead + AsyncWrite + Send + 'static> Writer for StreamWriter<S> {
    fn poll_write(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.with(|w| w.poll_write(cx, buf))
    }

    fn try_write(&self, _buf: &[u8]) -> Option<io::Result<usize>> {
        None
    }

    fn poll_flush(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.with(|w| w.poll_flush(cx))
    }

    fn poll_shutdown(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.with(|w| w.poll_shutdown(cx))
    }
}

/// The two halves of `stream`: sockets split as themselves, any other
/// stream through a lock.
pub(crate) fn split<S>(stream: S) -> (Box<dyn Reader>, Arc<dyn Writer>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let any: Box<dyn std::any::Any + Send> = Box::new(stream);
    let any = match any.downcast::<TcpStream>() {
        Ok(tcp) => {
            let (r, w) = tcp.into_split();
            return (Box::new(Half(r)), Arc::new(TcpWriter(w)));
        }
        Err(other) => other,
    };
    #[cfg(unix)]
    let any = match any.downcast::<UnixStream>() {
        Ok(unix) => {
            let (r, w) = unix.into_split();
            return (Box::new(Half(r)), Arc::new(UnixWriter(w)));
        }
        Err(other) => other,
    };
    match any.downcast::<S>() {
        Ok(s) => {
            let (r, w): (ReadHalf<S>, WriteHalf<S>) = tokio::io::split(*s);
            (Box::new(Half(r)), Arc::new(StreamWriter(Mutex::new(w))))
        }
        // `any` was made from an `S` a few lines up.
        Err(_) => unreachable!("the stream keeps its type"),
    }
}
