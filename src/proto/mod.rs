//! The protocol logic of a session, with no I/O and no runtime: the frames
//! the runtime builds, the session core, and the replay ledger. The tokio
//! side (`net`) drives them; tests and fuzz targets drive them with plain
//! values.

pub(crate) mod codec;
pub(crate) mod ledger;
pub(crate) mod session;
pub(crate) mod streams;
