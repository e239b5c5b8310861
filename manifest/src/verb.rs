//! Typed verb definitions shared by callers and handlers.

use std::any::TypeId;

use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::class::{DeclaredClass, VerbKind};

/// One verb, declared once in Rust types.
///
/// A caller (`peer.request::<V>(args)`) and the handler registered with
/// [`Capability::verb::<V>`](crate::Capability::verb) use the same item, so
/// they cannot disagree on the capability, the verb name, its class or its
/// argument and result types. Declare one with [`verb!`](crate::verb), which
/// also checks the id grammar at compile time.
///
/// A [`Notification`](VerbKind::Notification) has `Output = ()`; the
/// registry refuses to build if a notification declares any other output
/// type ([`ManifestError::NotificationWithResult`](crate::ManifestError::NotificationWithResult)).
pub trait VerbDef: 'static {
    /// The capability id, e.g. `"app.echo"`.
    const CAP: &'static str;
    /// The verb name, e.g. `"say"`.
    const VERB: &'static str;
    /// Request or notification.
    const KIND: VerbKind;
    /// Who may call it.
    const CLASS: DeclaredClass;
    /// The arguments, carried in the envelope's `args`.
    ///
    /// Its [`JsonSchema`] goes into the manifest as the verb's args schema.
    /// An app's own type derives it through this crate's re-export, with no
    /// `schemars` dependency of its own:
    ///
    /// ```
    /// #[derive(serde::Serialize, serde::Deserialize, capwire_manifest::JsonSchema)]
    /// #[schemars(crate = "capwire_manifest::schemars")]
    /// pub struct Greet { pub name: String }
    ///
    /// capwire_manifest::verb! {
    ///     pub struct Hello: request "app.greeter" / "hello", Bootstrap, Greet => String;
    /// }
    /// ```
    ///
    /// (Through the `capwire` crate, the same re-export is
    /// `capwire::JsonSchema` with `#[schemars(crate = "capwire::schemars")]`.)
    type Args: Serialize + DeserializeOwned + JsonSchema + Send + 'static;
    /// The result of a request; `()` for a notification. Its
    /// [`JsonSchema`] is the verb's result schema, derived as for
    /// [`Args`](Self::Args).
    type Output: Serialize + DeserializeOwned + JsonSchema + Send + 'static;
}

/// A [`VerbDef`] that is a request: sent with a request id and answered by
/// exactly one response.
///
/// [`verb!`](crate::verb) implements it for every `request` verb; the
/// runtime bounds `peer.request::<V>` with it, so that sending a
/// notification as a request does not compile. A hand-written `VerbDef`
/// implements it only if its [`KIND`](VerbDef::KIND) is
/// [`VerbKind::Request`].
///
/// ```
/// use capwire_manifest::{RequestVerb, verb};
/// verb! { pub struct Say: request "app.echo" / "say", Bootstrap, String => String; }
/// fn request<V: RequestVerb>(_: V, _: V::Args) {}
/// request(Say, "hello".to_owned());
/// ```
///
/// A notification is refused at compile time:
///
/// ```compile_fail,E0277
/// use capwire_manifest::{RequestVerb, verb};
/// verb! { pub struct Log: notification "app.echo" / "log", Bootstrap, String; }
/// fn request<V: RequestVerb>(_: V, _: V::Args) {}
/// request(Log, "a line".to_owned());
/// ```
pub trait RequestVerb: VerbDef {}

/// A [`VerbDef`] that is a notification: sent with an empty request id,
/// never answered, and with no result (`Output = ()`).
///
/// [`verb!`](crate::verb) implements it for every `notification` verb; the
/// runtime bounds `peer.notify::<V>` with it, so that firing a request and
/// forgetting its answer does not compile. A hand-written `VerbDef`
/// implements it only if its [`KIND`](VerbDef::KIND) is
/// [`VerbKind::Notification`].
///
/// ```
/// use capwire_manifest::{NotificationVerb, verb};
/// verb! { pub struct Log: notification "app.echo" / "log", Bootstrap, String; }
/// fn notify<V: NotificationVerb>(_: V, _: V::Args) {}
/// notify(Log, "a line".to_owned());
/// ```
///
/// A request is refused at compile time, even one whose result is `()`:
///
/// ```compile_fail,E0277
/// use capwire_manifest::{NotificationVerb, verb};
/// verb! { pub struct Reset: request "app.echo" / "reset", Controller, () => (); }
/// fn notify<V: NotificationVerb>(_: V, _: V::Args) {}
/// notify(Reset, ());
/// ```
///
/// So is `core.monitoring/bind`:
///
/// ```compile_fail,E0277
/// use capwire_manifest::{MonitoringBind, NotificationVerb};
/// fn notify<V: NotificationVerb>(_: V) {}
/// notify(MonitoringBind);
/// ```
pub trait NotificationVerb: VerbDef<Output = ()> {}

/// A [`VerbDef`] that is a stream (protocol 2): sent with a request id and
/// answered by any number of items of type [`Output`](VerbDef::Output),
/// each within the credit the caller grants, then one response that ends
/// it.
///
/// [`verb!`](crate::verb) implements it for every `stream` verb; the
/// runtime bounds `peer.stream::<V>` with it, so that streaming a request
/// verb, or sending a stream verb as a request, does not compile.
///
/// ```
/// use capwire_manifest::{StreamVerb, verb};
/// verb! { pub struct Generate: stream "app.llm" / "generate", Bootstrap, String => String; }
/// fn stream<V: StreamVerb>(_: V, _: V::Args) {}
/// stream(Generate, "a prompt".to_owned());
/// ```
///
/// A request is not a stream:
///
/// ```compile_fail,E0277
/// use capwire_manifest::{StreamVerb, verb};
/// verb! { pub struct Say: request "app.echo" / "say", Bootstrap, String => String; }
/// fn stream<V: StreamVerb>(_: V, _: V::Args) {}
/// stream(Say, "hello".to_owned());
/// ```
pub trait StreamVerb: VerbDef {}

/// A [`VerbDef`] that is a task (protocol 2): sent with a request id and
/// answered at once with the id of a durable task that runs on its own
/// (`core.tasks`); [`Output`](VerbDef::Output) is the task's result.
///
/// [`verb!`](crate::verb) implements it for every `task` verb.
///
/// ```
/// use capwire_manifest::{TaskVerb, verb};
/// verb! { pub struct Research: task "app.r" / "research", Bootstrap, String => String; }
/// fn submit<V: TaskVerb>(_: V, _: V::Args) {}
/// submit(Research, "a question".to_owned());
/// ```
pub trait TaskVerb: VerbDef {}

/// A [`VerbDef`] answered at most once: a request or a notification, the
/// verbs whose handlers return one value. [`verb!`](crate::verb)
/// implements it for both; a stream verb has a handler of another shape.
pub trait UnaryVerb: VerbDef {}

/// `true` when `V` declares a result, i.e. its output type is not `()`.
pub(crate) fn declares_result<V: VerbDef>() -> bool {
    TypeId::of::<V::Output>() != TypeId::of::<()>()
}

/// Declares a unit struct implementing [`VerbDef`], and [`RequestVerb`],
/// [`NotificationVerb`], [`StreamVerb`] or [`TaskVerb`] according to its
/// kind.
///
/// The syntax is
/// `VIS struct NAME: request "CAP" / "VERB", CLASS, ARGS => OUTPUT;`,
/// `VIS struct NAME: notification "CAP" / "VERB", CLASS, ARGS;` or
/// `VIS struct NAME: stream "CAP" / "VERB", CLASS, ARGS => ITEM;` or
/// `VIS struct NAME: task "CAP" / "VERB", CLASS, ARGS => RESULT;`, where
/// `CLASS` is a [`DeclaredClass`] variant (`Bootstrap` or `Controller`) and
/// the types implement serde's traits and [`JsonSchema`](crate::JsonSchema).
/// The expansion names only `$crate` and `::core` paths, so the macro works
/// re-exported (`capwire::manifest::verb!`) in a crate that depends on
/// neither this crate nor `schemars` directly.
///
/// ```
/// use capwire_manifest::{VerbDef, VerbKind, DeclaredClass, verb};
///
/// #[derive(serde::Serialize, serde::Deserialize, capwire_manifest::JsonSchema)]
/// #[schemars(crate = "capwire_manifest::schemars")]
/// pub struct SayArgs { pub text: String }
///
/// verb! {
///     /// Echoes `text` back.
///     pub struct Say: request "app.echo" / "say", Bootstrap, SayArgs => String;
/// }
/// verb! {
///     /// Logs a line; never answered.
///     pub struct Log: notification "app.echo" / "log", Controller, String;
/// }
///
/// assert_eq!(Say::CAP, "app.echo");
/// assert_eq!(Say::KIND, VerbKind::Request);
/// assert_eq!(Log::CLASS, DeclaredClass::Controller);
/// ```
///
/// A malformed id is a compile error:
///
/// ```compile_fail
/// capwire_manifest::verb! {
///     pub struct Bad: request "App.Echo" / "say", Bootstrap, () => ();
/// }
/// ```
#[macro_export]
macro_rules! verb {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident : request $cap:literal / $verb:literal, $class:ident,
        $args:ty => $out:ty $(;)?
    ) => {
        $crate::verb!(@def [$(#[$meta])*] $vis $name, $cap, $verb, Request, $class, $args, $out);
        impl $crate::RequestVerb for $name {}
        impl $crate::UnaryVerb for $name {}
    };
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident : notification $cap:literal / $verb:literal, $class:ident,
        $args:ty $(;)?
    ) => {
        $crate::verb!(@def [$(#[$meta])*] $vis $name, $cap, $verb, Notification, $class, $args, ());
        impl $crate::NotificationVerb for $name {}
        impl $crate::UnaryVerb for $name {}
    };
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident : stream $cap:literal / $verb:literal, $class:ident,
        $args:ty => $item:ty $(;)?
    ) => {
        $crate::verb!(@def [$(#[$meta])*] $vis $name, $cap, $verb, Stream, $class, $args, $item);
        impl $crate::StreamVerb for $name {}
    };
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident : task $cap:literal / $verb:literal, $class:ident,
        $args:ty => $out:ty $(;)?
    ) => {
        $crate::verb!(@def [$(#[$meta])*] $vis $name, $cap, $verb, Task, $class, $args, $out);
        impl $crate::TaskVerb for $name {}
    };
    (@def [$(#[$meta:meta])*] $vis:vis $name:ident, $cap:literal, $verb:literal, $kind:ident,
        $class:ident, $args:ty, $out:ty) => {
        $(#[$meta])*
        #[derive(
            ::core::fmt::Debug,
            ::core::clone::Clone,
            ::core::marker::Copy,
            ::core::default::Default,
            ::core::cmp::PartialEq,
            ::core::cmp::Eq,
            ::core::hash::Hash,
        )]
        $vis struct $name;

        const _: () = {
            ::core::assert!(
                $crate::cap_id_is_well_formed($cap),
                ::core::concat!("`", $cap, "` is not a well-formed capability id (`core.*` or `app.*`)")
            );
            ::core::assert!(
                $crate::verb_is_well_formed($verb),
                ::core::concat!("`", $verb, "` is not a well-formed verb (`[a-z][a-z0-9_]*`)")
            );
        };

        impl $crate::VerbDef for $name {
            const CAP: &'static str = $cap;
            const VERB: &'static str = $verb;
            const KIND: $crate::VerbKind = $crate::VerbKind::$kind;
            const CLASS: $crate::DeclaredClass = $crate::DeclaredClass::$class;
            type Args = $args;
            type Output = $out;
        }
    };
}

const fn is_segment(b: &[u8], start: usize, end: usize) -> bool {
    if start >= end || !b[start].is_ascii_lowercase() {
        return false;
    }
    let mut i = start + 1;
    while i < end {
        let c = b[i];
        if !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_') {
            return false;
        }
        i += 1;
    }
    true
}

/// The capability id grammar as a `const fn`, for compile-time checks:
/// `("core" | "app") ("." [a-z][a-z0-9_]*)+`, at most
/// [`MAX_CAP_ID_LEN`](capwire_envelope::MAX_CAP_ID_LEN) bytes. Agrees with
/// [`CapId::try_from`](capwire_envelope::CapId).
///
/// ```
/// assert!(capwire_manifest::cap_id_is_well_formed("app.echo"));
/// assert!(!capwire_manifest::cap_id_is_well_formed("app.x/../y"));
/// ```
pub const fn cap_id_is_well_formed(s: &str) -> bool {
    let b = s.as_bytes();
    if b.is_empty() || b.len() > capwire_envelope::MAX_CAP_ID_LEN {
        return false;
    }
    let mut start = if starts_with(b, b"core.") {
        5
    } else if starts_with(b, b"app.") {
        4
    } else {
        return false;
    };
    let mut i = start;
    while i <= b.len() {
        if i == b.len() || b[i] == b'.' {
            if !is_segment(b, start, i) {
                return false;
            }
            start = i + 1;
        }
        i += 1;
    }
    true
}

/// The verb grammar as a `const fn`: `[a-z][a-z0-9_]*`, at most
/// [`MAX_VERB_LEN`](capwire_envelope::MAX_VERB_LEN) bytes. Agrees with
/// [`Verb::try_from`](capwire_envelope::Verb).
///
/// ```
/// assert!(capwire_manifest::verb_is_well_formed("get_config"));
/// assert!(!capwire_manifest::verb_is_well_formed("Disable"));
/// ```
pub const fn verb_is_well_formed(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() <= capwire_envelope::MAX_VERB_LEN && is_segment(b, 0, b.len())
}

const fn starts_with(b: &[u8], prefix: &[u8]) -> bool {
    if b.len() < prefix.len() {
        return false;
    }
    let mut i = 0;
    while i < prefix.len() {
        if b[i] != prefix[i] {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use capwire_envelope::{CapId, Verb};
    use proptest::prelude::*;

    fn id_like() -> impl Strategy<Value = String> {
        prop_oneof![
            "(core|app|App|apps|)(\\.[a-z0-9_A-Z./ ]{0,8}){0,4}",
            "[a-z.]{0,70}",
            any::<String>(),
        ]
    }

    proptest! {
        #[test]
        fn const_grammar_agrees_with_the_envelope(s in id_like()) {
            prop_assert_eq!(cap_id_is_well_formed(&s), CapId::try_from(s.as_str()).is_ok());
            prop_assert_eq!(verb_is_well_formed(&s), Verb::try_from(s.as_str()).is_ok());
        }
    }

    #[test]
    fn grammar_edges() {
        for ok in ["core.monitoring", "app.echo", "app.a.b_c9", "core.x"] {
            assert!(cap_id_is_well_formed(ok), "{ok}");
        }
        for bad in [
            "",
            "core",
            "app.",
            "app..x",
            ".app.x",
            "app.x.",
            "App.x",
            "app.9x",
            "app.x y",
            "app.x\0",
            "app.x/../y",
            "app.é",
        ] {
            assert!(!cap_id_is_well_formed(bad), "{bad:?}");
        }
        let long = format!("app.{}", "a".repeat(capwire_envelope::MAX_CAP_ID_LEN));
        assert!(!cap_id_is_well_formed(&long));
        assert!(verb_is_well_formed("bind"));
        assert!(!verb_is_well_formed(""));
        assert!(!verb_is_well_formed(
            &"a".repeat(capwire_envelope::MAX_VERB_LEN + 1)
        ));
    }
}
