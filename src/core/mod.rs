//! The framework's own capabilities, one file each, registered like
//! application capabilities and reaching the node only through narrow
//! handles.

pub(crate) mod monitoring;
