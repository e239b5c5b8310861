//! The framework's own capabilities, one file each, registered like
//! application capabilities and reaching the node only through the
//! narrow [`Core`](state::Core) handle; and the durable state they share.
//!
//! ```text
//!  monitoring  configuration  connect  cluster ──► host (children)
//!        \           |           |       /
//!         state (durable state, exactly-once answers) ──► store
//!          roster, answers, events: plain values
//! ```

pub(crate) mod answers;
pub(crate) mod audit;
pub(crate) mod cluster;
pub(crate) mod configuration;
pub(crate) mod connect;
pub(crate) mod events;
pub(crate) mod grant_state;
pub(crate) mod grants;
pub(crate) mod monitoring;
pub(crate) mod protocol;
pub(crate) mod roster;
pub(crate) mod state;
pub(crate) mod tasks;
