//! The registry: the single source of truth for the manifest, the
//! chokepoint's classification and the dispatch routes.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use std::ops::Range;

use capwire_envelope::{CapId, MAX_CAP_ID_LEN, MAX_VERB_LEN, Namespace, NodeId, Verb};
use semver::Version;

use crate::class::{DeclaredClass, VerbKind};
use crate::error::ManifestError;
use crate::limits::{MAX_APP_ID_LEN, MAX_DESCRIPTION_LEN, MAX_MANIFEST_LEN, MAX_NAME_LEN};
use crate::manifest::{CapabilityManifest, Manifest, MonitoringStatus, VerbManifest};
use crate::monitoring::{self, MonitoringBind, MonitoringDisable};
use crate::spec::{Capability, VerbSpec};
use crate::validate::{check_len, check_params, check_schema, encoded_len};
use crate::verb::VerbDef;

/// Who a node is, as its manifest says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node's identity.
    pub node_id: NodeId,
    /// The application it runs, at most [`MAX_APP_ID_LEN`] bytes.
    pub app_id: String,
    /// A human-readable name, at most [`MAX_NAME_LEN`] bytes.
    pub name: String,
    /// A human-readable description, at most [`MAX_DESCRIPTION_LEN`] bytes.
    pub description: String,
}

impl NodeInfo {
    /// Named after its app, with an empty description.
    pub fn new(node_id: NodeId, app_id: impl Into<String>) -> Self {
        let app_id = app_id.into();
        Self {
            node_id,
            name: app_id.clone(),
            app_id,
            description: String::new(),
        }
    }

    /// Sets the name.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets the description.
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }
}

/// The handlers of `core.monitoring`, which every registry has: the builder
/// cannot be created without them.
#[derive(Debug, Clone)]
pub struct MonitoringHandlers<H> {
    /// Handles `core.monitoring/bind` (bootstrap): the bind ceremony.
    pub bind: H,
    /// Handles `core.monitoring/disable` (controller): unbinds.
    pub disable: H,
}

/// What the registry knows about one verb, apart from its handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerbInfo {
    cap: CapId,
    verb: Verb,
    kind: VerbKind,
    class: DeclaredClass,
    args_schema: Option<Box<str>>,
    result_schema: Option<Box<str>>,
}

impl VerbInfo {
    /// The capability id.
    pub fn cap(&self) -> &CapId {
        &self.cap
    }

    /// The verb name.
    pub fn verb(&self) -> &Verb {
        &self.verb
    }

    /// Request or notification.
    pub fn kind(&self) -> VerbKind {
        self.kind
    }

    /// The declared auth class.
    pub fn class(&self) -> DeclaredClass {
        self.class
    }

    /// The JSON Schema of the args as JSON text, if declared.
    pub fn args_schema(&self) -> Option<&str> {
        self.args_schema.as_deref()
    }

    /// The JSON Schema of the result as JSON text, if declared.
    pub fn result_schema(&self) -> Option<&str> {
        self.result_schema.as_deref()
    }
}

/// A dispatch route: a verb's metadata and its handler.
pub struct Route<H> {
    class: DeclaredClass,
    info: Arc<VerbInfo>,
    handler: H,
}

impl<H> Route<H> {
    /// The verb's metadata.
    pub fn info(&self) -> &Arc<VerbInfo> {
        &self.info
    }

    /// The declared auth class (the same as `info().class()`, without the
    /// indirection).
    pub fn class(&self) -> DeclaredClass {
        self.class
    }

    /// The handler, without any authorization.
    ///
    /// Dispatch must not use this: it gets the handler from the permit the
    /// chokepoint grants (`capwire_authz::decide`). This exists for the
    /// chokepoint itself and for tooling that inspects a registry.
    pub fn dangerous_handler(&self) -> &H {
        &self.handler
    }
}

impl<H> fmt::Debug for Route<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Route")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

struct CapEntry {
    id: CapId,
    version: Version,
    params: Option<String>,
    routes: Range<usize>,
}

/// The lookup tables' hasher: fast, and seeded per process. The tables are
/// built once from the node's own declarations and never grow from peer
/// input, so peer-chosen keys can only be looked up, never inserted: no
/// input can lengthen a probe sequence.
type FastState = foldhash::fast::RandomState;

/// Longest lookup key: a capability id, one separator byte, a verb.
const KEY_LEN: usize = MAX_CAP_ID_LEN + 1 + MAX_VERB_LEN;
/// Separates cap and verb in a lookup key. It never occurs in UTF-8 text,
/// so `cap ++ [SEP] ++ verb` is unambiguous for any pair of strings.
const SEP: u8 = 0xff;

/// Writes the lookup key of `cap`/`verb` into `buf`; `None` when either is
/// longer than any declared name can be.
fn route_key<'b>(buf: &'b mut [u8; KEY_LEN], cap: &str, verb: &str) -> Option<&'b [u8]> {
    let (cap, verb) = (cap.as_bytes(), verb.as_bytes());
    if cap.len() > MAX_CAP_ID_LEN || verb.len() > MAX_VERB_LEN {
        return None;
    }
    let len = cap.len() + 1 + verb.len();
    let (head, tail) = buf.split_at_mut(cap.len());
    head.copy_from_slice(cap);
    let (sep, rest) = tail.split_first_mut()?;
    *sep = SEP;
    rest.get_mut(..verb.len())?.copy_from_slice(verb);
    buf.get(..len)
}

/// The immutable table of a node's capabilities and verbs.
///
/// Built once by [`RegistryBuilder`], which checks every invariant; read by
/// the manifest ([`Registry::manifest`]), the chokepoint
/// ([`Registry::lookup`]) and dispatch. `core.monitoring` with `bind`
/// (bootstrap) and `disable` (controller) is always present.
///
/// `H` is the runtime's handler type; this crate never calls it.
pub struct Registry<H> {
    info: NodeInfo,
    caps: Box<[CapEntry]>,
    routes: Box<[Route<H>]>,
    cap_index: HashMap<Box<str>, usize, FastState>,
    route_index: HashMap<Box<[u8]>, usize, FastState>,
}

impl<H> Registry<H> {
    /// Starts a registry for `info`, with the handlers of `core.monitoring`.
    pub fn builder(info: NodeInfo, monitoring: MonitoringHandlers<H>) -> RegistryBuilder<H> {
        RegistryBuilder {
            info,
            monitoring,
            monitoring_verbs: Vec::new(),
            caps: Vec::new(),
        }
    }

    /// The route of `cap`/`verb`, matched as exact bytes: no case folding,
    /// trimming, prefix or unicode normalisation. Any strings are accepted;
    /// an undeclared pair is `None`. One hash lookup; does not allocate.
    pub fn lookup(&self, cap: &str, verb: &str) -> Option<&Route<H>> {
        let mut buf = [0u8; KEY_LEN];
        let key = route_key(&mut buf, cap, verb)?;
        self.routes.get(*self.route_index.get(key)?)
    }

    /// `true` when a capability has exactly this id. Does not allocate.
    pub fn has_capability(&self, cap: &str) -> bool {
        self.cap_index.contains_key(cap)
    }

    /// Who this node is.
    pub fn info(&self) -> &NodeInfo {
        &self.info
    }

    /// Every route, by capability id then verb name.
    pub fn routes(&self) -> impl Iterator<Item = &Route<H>> {
        self.routes.iter()
    }

    /// The number of (cap, verb) routes.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// Always `false`: `core.monitoring` is always present.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// The manifest for this registry, with the given monitoring status and
    /// epoch. [`ManifestTracker`](crate::ManifestTracker) keeps the epoch.
    pub fn manifest(&self, monitoring: MonitoringStatus, epoch: u64) -> Manifest {
        Manifest {
            node_id: self.info.node_id,
            app_id: self.info.app_id.clone(),
            name: self.info.name.clone(),
            description: self.info.description.clone(),
            epoch,
            monitoring,
            capabilities: self
                .caps
                .iter()
                .map(|c| CapabilityManifest {
                    id: c.id.clone(),
                    version: c.version.clone(),
                    params: c.params.clone(),
                    verbs: self
                        .routes
                        .get(c.routes.clone())
                        .unwrap_or_default()
                        .iter()
                        .map(|r| VerbManifest {
                            name: r.info.verb.clone(),
                            kind: r.info.kind,
                            class: r.info.class,
                            args_schema: r.info.args_schema.as_deref().map(str::to_owned),
                            result_schema: r.info.result_schema.as_deref().map(str::to_owned),
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

impl<H> fmt::Debug for Registry<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("info", &self.info)
            .field("routes", &self.routes().collect::<Vec<_>>())
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    App,
    Core,
}

/// Collects capability declarations and checks them into a [`Registry`].
pub struct RegistryBuilder<H> {
    info: NodeInfo,
    monitoring: MonitoringHandlers<H>,
    monitoring_verbs: Vec<VerbSpec<H>>,
    caps: Vec<(Origin, Capability<H>)>,
}

impl<H> fmt::Debug for RegistryBuilder<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryBuilder")
            .field("info", &self.info)
            .field(
                "capabilities",
                &self.caps.iter().map(|(_, c)| c.id()).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl<H> RegistryBuilder<H> {
    /// Adds an application capability; its id must be under `app.*`.
    pub fn capability(mut self, cap: Capability<H>) -> Self {
        self.caps.push((Origin::App, cap));
        self
    }

    /// Adds a verb to `core.monitoring` besides `bind` and `disable` (the
    /// node runtime's `status` and `copy`). Checked like any other verb:
    /// it must belong to `core.monitoring`.
    pub fn monitoring_verb<V: VerbDef>(mut self, handler: H) -> Self {
        self.monitoring_verbs.push(VerbSpec::typed::<V>(handler));
        self
    }

    /// Adds a framework capability; its id must be under `core.*`. For the
    /// node runtime's own capabilities (`core.configuration`, ...).
    pub fn core_capability(mut self, cap: Capability<H>) -> Self {
        self.caps.push((Origin::Core, cap));
        self
    }

    /// Checks every declaration and builds the registry.
    ///
    /// The manifest the registry produces is then held to the rules a
    /// receiver checks ([`Manifest::validate`] and [`MAX_MANIFEST_LEN`],
    /// with the longest monitoring status and epoch), so that a node never
    /// sends a manifest its peers would refuse.
    ///
    /// # Errors
    /// The first breach, in declaration order (`core.monitoring` first):
    /// [`ManifestError::FieldTooLong`] (node info),
    /// [`ManifestError::InvalidCapId`], [`ManifestError::ReservedNamespace`]
    /// (an app under `core.*`), [`ManifestError::NotCoreNamespace`],
    /// [`ManifestError::ParamsTooLong`],
    /// [`ManifestError::CapabilityWithoutHandler`],
    /// [`ManifestError::InvalidVerb`], [`ManifestError::VerbInWrongCapability`],
    /// [`ManifestError::DuplicateVerb`], [`ManifestError::MissingAuthClass`],
    /// [`ManifestError::NotificationWithResult`],
    /// [`ManifestError::MissingHandler`], [`ManifestError::SchemaTooLong`]
    /// or [`ManifestError::DuplicateCapability`]; then
    /// [`ManifestError::TooManyCapabilities`],
    /// [`ManifestError::TooManyVerbs`] or
    /// [`ManifestError::ManifestTooLarge`].
    pub fn build(self) -> Result<Registry<H>, ManifestError> {
        let Self {
            info,
            monitoring,
            monitoring_verbs,
            caps,
        } = self;
        check_len("app_id", &info.app_id, MAX_APP_ID_LEN)?;
        check_len("name", &info.name, MAX_NAME_LEN)?;
        check_len("description", &info.description, MAX_DESCRIPTION_LEN)?;

        let mut core_monitoring =
            Capability::new(monitoring::CORE_MONITORING, monitoring::version())
                .verb::<MonitoringBind>(monitoring.bind)
                .verb::<MonitoringDisable>(monitoring.disable);
        for spec in monitoring_verbs {
            core_monitoring = core_monitoring.verb_spec(spec);
        }

        let mut seen = HashSet::new();
        let mut entries = Vec::with_capacity(caps.len() + 1);
        for (origin, cap) in std::iter::once((Origin::Core, core_monitoring)).chain(caps) {
            let (entry, routes) = check_capability(origin, cap)?;
            if !seen.insert(entry.id.clone()) {
                return Err(ManifestError::DuplicateCapability { cap: entry.id });
            }
            entries.push((entry, routes));
        }
        entries.sort_by(|a, b| a.0.id.cmp(&b.0.id));

        let mut caps = Vec::with_capacity(entries.len());
        let mut routes = Vec::new();
        let mut cap_index = HashMap::with_capacity_and_hasher(entries.len(), FastState::default());
        let mut route_index = HashMap::with_hasher(FastState::default());
        for (mut entry, cap_routes) in entries {
            let start = routes.len();
            for route in cap_routes {
                let mut buf = [0u8; KEY_LEN];
                // Declared names are within the length bounds, so a key exists.
                if let Some(key) = route_key(&mut buf, entry.id.as_str(), route.info.verb.as_str())
                {
                    route_index.insert(Box::from(key), routes.len());
                }
                routes.push(route);
            }
            entry.routes = start..routes.len();
            cap_index.insert(Box::from(entry.id.as_str()), caps.len());
            caps.push(entry);
        }
        let registry = Registry {
            info,
            caps: caps.into_boxed_slice(),
            routes: routes.into_boxed_slice(),
            cap_index,
            route_index,
        };
        // The longest status and epoch give the longest encoding.
        let manifest = registry.manifest(MonitoringStatus::Pending, u64::MAX);
        manifest.validate()?;
        let len = encoded_len(&manifest)?;
        if len > MAX_MANIFEST_LEN {
            return Err(ManifestError::ManifestTooLarge {
                len,
                max: MAX_MANIFEST_LEN,
            });
        }
        Ok(registry)
    }
}

fn check_capability<H>(
    origin: Origin,
    cap: Capability<H>,
) -> Result<(CapEntry, Vec<Route<H>>), ManifestError> {
    let id = CapId::try_from(cap.id.as_str()).map_err(|source| ManifestError::InvalidCapId {
        cap: cap.id.clone(),
        source,
    })?;
    match (origin, id.namespace()) {
        (Origin::App, Namespace::Core) => return Err(ManifestError::ReservedNamespace { cap: id }),
        (Origin::Core, Namespace::App) => return Err(ManifestError::NotCoreNamespace { cap: id }),
        _ => {}
    }
    if let Some(params) = &cap.params {
        check_params(&id, params)?;
    }
    if cap.verbs.is_empty() {
        return Err(ManifestError::CapabilityWithoutHandler { cap: id });
    }
    let mut routes: Vec<Route<H>> = Vec::with_capacity(cap.verbs.len());
    for spec in cap.verbs {
        let route = check_verb(&id, spec)?;
        if routes.iter().any(|r| r.info.verb == route.info.verb) {
            return Err(ManifestError::DuplicateVerb {
                cap: id,
                verb: route.info.verb.clone(),
            });
        }
        routes.push(route);
    }
    routes.sort_by(|a, b| a.info.verb.cmp(&b.info.verb));
    Ok((
        CapEntry {
            id,
            version: cap.version,
            params: cap.params,
            routes: 0..0,
        },
        routes,
    ))
}

fn check_verb<H>(cap: &CapId, spec: VerbSpec<H>) -> Result<Route<H>, ManifestError> {
    let verb = Verb::try_from(spec.name.as_str()).map_err(|source| ManifestError::InvalidVerb {
        cap: cap.clone(),
        verb: spec.name.clone(),
        source,
    })?;
    if let Some(declared) = spec.typed_cap
        && declared != cap.as_str()
    {
        return Err(ManifestError::VerbInWrongCapability {
            cap: cap.clone(),
            verb,
            declared,
        });
    }
    let Some(class) = spec.class else {
        return Err(ManifestError::MissingAuthClass {
            cap: cap.clone(),
            verb,
        });
    };
    if spec.kind == VerbKind::Notification && spec.declares_result {
        return Err(ManifestError::NotificationWithResult {
            cap: cap.clone(),
            verb,
        });
    }
    let Some(handler) = spec.handler else {
        return Err(ManifestError::MissingHandler {
            cap: cap.clone(),
            verb,
        });
    };
    for (field, schema) in [
        ("args_schema", &spec.args_schema),
        ("result_schema", &spec.result_schema),
    ] {
        if let Some(schema) = schema {
            check_schema(cap, &verb, field, schema)?;
        }
    }
    Ok(Route {
        class,
        info: Arc::new(VerbInfo {
            cap: cap.clone(),
            verb,
            kind: spec.kind,
            class,
            args_schema: spec.args_schema.map(String::into_boxed_str),
            result_schema: spec.result_schema.map(String::into_boxed_str),
        }),
        handler,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(cap: &str, verb: &str) -> Option<Vec<u8>> {
        let mut buf = [0u8; KEY_LEN];
        route_key(&mut buf, cap, verb).map(<[u8]>::to_vec)
    }

    proptest! {
        #[test]
        fn route_keys_are_injective(
            c1 in "[a.b]{0,4}", v1 in "[a.b]{0,4}", c2 in "[a.b]{0,4}", v2 in "[a.b]{0,4}",
        ) {
            prop_assert_eq!(key(&c1, &v1) == key(&c2, &v2), (c1, v1) == (c2, v2));
        }
    }

    #[test]
    fn route_keys_cover_the_longest_names_and_refuse_longer() {
        let cap = format!("app.{}", "c".repeat(MAX_CAP_ID_LEN - 4));
        let verb = "v".repeat(MAX_VERB_LEN);
        assert_eq!(key(&cap, &verb).unwrap().len(), KEY_LEN);
        assert!(key(&format!("{cap}c"), &verb).is_none());
        assert!(key(&cap, &format!("{verb}v")).is_none());
        assert_eq!(key("", "").unwrap(), [SEP]);
        // The separator cannot be forged: it is not valid in any `str`.
        assert!(std::str::from_utf8(&[SEP]).is_err());
    }
}
