//! The size bounds of a manifest (`WIRE.md` section 3.1): field lengths,
//! counts and the encoded length.
//!
//! A leaf: it imports nothing from the crate.

/// Longest `app_id`, in bytes.
pub const MAX_APP_ID_LEN: usize = 64;
/// Longest `name`, in bytes.
pub const MAX_NAME_LEN: usize = 128;
/// Longest `description`, in bytes.
pub const MAX_DESCRIPTION_LEN: usize = 1024;
/// Longest capability params text, in bytes.
pub const MAX_PARAMS_LEN: usize = 4096;
/// Longest JSON Schema text of a verb's args or result, in bytes.
pub const MAX_SCHEMA_LEN: usize = 16 * 1024;
/// Most capabilities one manifest lists, `core.monitoring` included.
pub const MAX_CAPABILITIES: usize = 128;
/// Most verbs one capability lists.
pub const MAX_VERBS: usize = 128;
/// Longest encoded manifest, in bytes (1 MiB). A receiver checks it on the
/// bytes, before decoding anything.
pub const MAX_MANIFEST_LEN: usize = 1 << 20;
