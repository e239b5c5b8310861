//! Authorization classes and verb kinds.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How the chokepoint classifies a (capability, verb) pair.
///
/// Every pair a registry declares is [`Bootstrap`](AuthClass::Bootstrap) or
/// [`Controller`](AuthClass::Controller); everything else, including every
/// string that is not declared byte for byte, is [`Deny`](AuthClass::Deny).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuthClass {
    /// Allowed to any peer that passed the transport's contact policy.
    Bootstrap,
    /// Allowed only to the node's bound control plane.
    Controller,
    /// Never allowed: unknown or unlisted.
    Deny,
}

impl AuthClass {
    /// The stable lowercase name: `bootstrap`, `controller` or `deny`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Bootstrap => "bootstrap",
            Self::Controller => "controller",
            Self::Deny => "deny",
        }
    }
}

impl fmt::Display for AuthClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The class a verb declaration may carry: a reachable verb is always
/// consciously classified, and [`AuthClass::Deny`] cannot be declared.
///
/// On the wire (in a [`Manifest`](crate::Manifest)) it is the text
/// `"bootstrap"` or `"controller"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeclaredClass {
    /// Allowed to any peer that passed the transport's contact policy.
    Bootstrap,
    /// Allowed only to the node's bound control plane.
    Controller,
}

impl DeclaredClass {
    /// The stable lowercase name: `bootstrap` or `controller`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Bootstrap => "bootstrap",
            Self::Controller => "controller",
        }
    }
}

impl From<DeclaredClass> for AuthClass {
    fn from(class: DeclaredClass) -> Self {
        match class {
            DeclaredClass::Bootstrap => Self::Bootstrap,
            DeclaredClass::Controller => Self::Controller,
        }
    }
}

impl fmt::Display for DeclaredClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a verb is answered.
///
/// On the wire it is the text `"request"`, `"notification"` or (protocol
/// 2) `"stream"` or `"task"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum VerbKind {
    /// Sent with a request id; answered by exactly one response.
    Request,
    /// Sent with an empty request id; never answered, declares no result.
    Notification,
    /// Sent with a request id (protocol 2); answered by any number of
    /// items, each within the caller's credit, then exactly one response
    /// that ends the stream. Its declared result is the type of one item.
    Stream,
    /// Sent with a request id (protocol 2); answered at once with the id of
    /// a durable task (`core.tasks`) that then runs on its own; its
    /// declared result is the task's result.
    Task,
}

impl VerbKind {
    /// The stable lowercase name: `request`, `notification` or `stream`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Request => "request",
            Self::Notification => "notification",
            Self::Stream => "stream",
            Self::Task => "task",
        }
    }

    /// The lowest protocol version that has this kind: 2 for streams and
    /// tasks.
    pub const fn since(self) -> u32 {
        match self {
            Self::Stream | Self::Task => 2,
            Self::Request | Self::Notification => 1,
        }
    }
}

impl fmt::Display for VerbKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
