//! capwire-transport.
