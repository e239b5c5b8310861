//! capwire-manifest.
