//! Capability and verb declarations, typed and untyped.

use schemars::{JsonSchema, SchemaGenerator};
use semver::Version;

use crate::class::{DeclaredClass, VerbKind};
use crate::verb::{VerbDef, declares_result};

/// A capability as declared to the [`RegistryBuilder`](crate::RegistryBuilder):
/// id, version, params and verbs with their handlers.
///
/// Nothing is checked here; [`RegistryBuilder::build`](crate::RegistryBuilder::build)
/// checks every invariant and names the first breach.
///
/// ```
/// use capwire_manifest::{Capability, DeclaredClass, VerbSpec, Version};
///
/// let cap: Capability<&str> = Capability::new("app.echo", Version::new(1, 2, 0))
///     .params("no configuration")
///     .verb_spec(VerbSpec::request("say").class(DeclaredClass::Bootstrap).handler("say handler"));
/// assert_eq!(cap.id(), "app.echo");
/// ```
#[derive(Debug, Clone)]
pub struct Capability<H> {
    pub(crate) id: String,
    pub(crate) version: Version,
    pub(crate) params: Option<String>,
    pub(crate) verbs: Vec<VerbSpec<H>>,
}

impl<H> Capability<H> {
    /// A capability with no verbs yet.
    pub fn new(id: impl Into<String>, version: Version) -> Self {
        Self {
            id: id.into(),
            version,
            params: None,
            verbs: Vec::new(),
        }
    }

    /// The id as declared (not yet validated).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Describes the capability's configuration: an opaque text, such as a
    /// JSON Schema or a sentence.
    pub fn params(mut self, params: impl Into<String>) -> Self {
        self.params = Some(params.into());
        self
    }

    /// Adds the typed verb `V` with its handler.
    ///
    /// The verb's name, kind, class and the JSON Schemas of its args and
    /// result all come from `V`. `V::CAP` must equal this capability's id
    /// (checked at build).
    pub fn verb<V: VerbDef>(mut self, handler: H) -> Self {
        self.verbs.push(VerbSpec::typed::<V>(handler));
        self
    }

    /// Adds an untyped verb declaration.
    pub fn verb_spec(mut self, spec: VerbSpec<H>) -> Self {
        self.verbs.push(spec);
        self
    }
}

/// One verb as declared: name, kind, class, optional schemas and handler.
///
/// The untyped path, for core capabilities and tests. The class and the
/// handler are optional here only so that the registry can refuse a
/// declaration without them with a clear error.
#[derive(Debug, Clone)]
pub struct VerbSpec<H> {
    pub(crate) typed_cap: Option<&'static str>,
    pub(crate) name: String,
    pub(crate) kind: VerbKind,
    pub(crate) class: Option<DeclaredClass>,
    pub(crate) args_schema: Option<String>,
    pub(crate) result_schema: Option<String>,
    pub(crate) declares_result: bool,
    pub(crate) handler: Option<H>,
}

impl<H> VerbSpec<H> {
    fn new(name: String, kind: VerbKind) -> Self {
        Self {
            typed_cap: None,
            name,
            kind,
            class: None,
            args_schema: None,
            result_schema: None,
            declares_result: false,
            handler: None,
        }
    }

    /// A request verb (answered by exactly one response).
    pub fn request(name: impl Into<String>) -> Self {
        Self::new(name.into(), VerbKind::Request)
    }

    /// A notification verb (never answered; declares no result).
    pub fn notification(name: impl Into<String>) -> Self {
        Self::new(name.into(), VerbKind::Notification)
    }

    /// A stream verb (protocol 2: items, then one response).
    pub fn stream(name: impl Into<String>) -> Self {
        Self::new(name.into(), VerbKind::Stream)
    }

    /// A task verb (protocol 2: answered with a task id).
    pub fn task(name: impl Into<String>) -> Self {
        Self::new(name.into(), VerbKind::Task)
    }

    /// The typed declaration of `V`, with its handler.
    pub fn typed<V: VerbDef>(handler: H) -> Self {
        let declares = declares_result::<V>();
        Self {
            typed_cap: Some(V::CAP),
            name: V::VERB.to_owned(),
            kind: V::KIND,
            class: Some(V::CLASS),
            args_schema: schema_text_for::<V::Args>(V::CAP),
            result_schema: declares
                .then(|| schema_text_for::<V::Output>(V::CAP))
                .flatten(),
            declares_result: declares,
            handler: Some(handler),
        }
    }

    /// Sets the auth class. A verb without one is refused at build.
    pub fn class(mut self, class: DeclaredClass) -> Self {
        self.class = Some(class);
        self
    }

    /// Sets the JSON Schema of the args.
    pub fn args_schema(mut self, schema: &serde_json::Value) -> Self {
        self.args_schema = Some(schema.to_string());
        self
    }

    /// Declares a result with this JSON Schema. A notification that declares
    /// a result is refused at build.
    pub fn result_schema(mut self, schema: &serde_json::Value) -> Self {
        self.result_schema = Some(schema.to_string());
        self.declares_result = true;
        self
    }

    /// Sets the handler. A verb without one is refused at build.
    pub fn handler(mut self, handler: H) -> Self {
        self.handler = Some(handler);
        self
    }

    /// The verb name as declared (not yet validated).
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The JSON Schema of `T` as compact JSON text.
pub(crate) fn schema_text<T: JsonSchema>() -> String {
    SchemaGenerator::default()
        .into_root_schema_for::<T>()
        .as_value()
        .to_string()
}

/// The schema of a verb of capability `cap`, as its manifest carries it:
/// an application's (its documentation for callers), and none for the
/// framework's own `core.*` verbs, which WIRE.md specifies: their schemas
/// would otherwise be most of every hello, sent on every session to peers
/// that never read them.
fn schema_text_for<T: JsonSchema>(cap: &str) -> Option<String> {
    (!cap.starts_with("core.")).then(schema_text::<T>)
}

#[cfg(test)]
mod schema_tests {
    use super::*;

    /// Documented, with a field named `description`.
    #[derive(JsonSchema)]
    #[allow(dead_code)]
    struct Doc {
        /// The text.
        description: String,
        /// A count.
        n: u32,
    }

    #[test]
    fn app_schemas_keep_their_texts_and_core_verbs_carry_none() {
        let app: serde_json::Value =
            serde_json::from_str(&schema_text_for::<Doc>("app.x").unwrap()).unwrap();
        assert_eq!(
            app["description"],
            "Documented, with a field named `description`."
        );
        assert_eq!(app["properties"]["n"]["description"], "A count.");
        assert_eq!(app["required"], serde_json::json!(["description", "n"]));
        assert_eq!(schema_text_for::<Doc>("core.x"), None);
    }
}
