//! capwire-authz.
