//! capwire: capability-aware, authenticated messaging between the nodes of an
//! agent cluster.

pub use capwire_envelope as envelope;
