//! Wire records of capwire and the strict CBOR profile they travel in.
//!
//! ```
//! use capwire_envelope::{CapId, NodeId, ReqId, Verb};
//! let cap = CapId::try_from("app.echo").unwrap();
//! let verb = Verb::try_from("say").unwrap();
//! assert_eq!(cap.as_str(), "app.echo");
//! assert_eq!(verb.as_str(), "say");
//! assert!(ReqId::EMPTY.is_fire_and_forget());
//! let id: NodeId = "00".repeat(32).parse().unwrap();
//! assert_eq!(id.as_bytes(), &[0; 32]);
//! ```

mod id;

pub use id::{
    CapId, IdError, MAX_CAP_ID_LEN, MAX_REQ_ID_LEN, MAX_VERB_LEN, Namespace, NodeId, ReqId, Verb,
};
