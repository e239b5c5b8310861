//! The node: started from what the Python layer declared, its handlers
//! bridged to the loop it was started on.

use std::sync::{Arc, Mutex, Weak};

use capwire::envelope::RawValue;
use capwire::manifest::DeclaredClass;
use capwire::prometheus::MetricsServer;
use capwire::{Addr, Capability, Contact, Invite, Items, Meta, RawVerb, Sender, Task};
use pyo3::prelude::*;

use crate::args::{node_id, seconds, value_error};
use crate::bridge::Bridge;
use crate::errors;
use crate::errors::Fail;
use crate::handlers::{self, Extra};
use crate::peer::Peer;
use crate::value;

fn addr(text: &str) -> PyResult<Addr> {
    text.parse()
        .map_err(|e| value_error(format!("not an address: {e}")))
}

/// One verb as the Python layer declared it.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct VerbDecl {
    cap: String,
    version: String,
    name: String,
    /// `request`, `notification`, `stream` or `task`.
    kind: String,
    /// `bootstrap` or `controller`.
    auth: String,
    args_schema: Option<String>,
    result_schema: Option<String>,
    invoke: Py<PyAny>,
    resumable: bool,
    /// For a task verb: checks its args before the task is written.
    check: Option<Py<PyAny>>,
}

fn schema(text: &Option<String>) -> PyResult<Option<serde_json::Value>> {
    text.as_deref()
        .map(|t| {
            serde_json::from_str(t).map_err(|e| value_error(format!("a schema is not JSON: {e}")))
        })
        .transpose()
}

/// Adds `decl` to `cap`, its handler bridged to the loop.
fn add_verb(cap: Capability, decl: VerbDecl, bridge: &Bridge) -> PyResult<Capability> {
    let class = match decl.auth.as_str() {
        "bootstrap" => DeclaredClass::Bootstrap,
        "controller" => DeclaredClass::Controller,
        other => {
            return Err(value_error(format!(
                "auth must be bootstrap or controller, not {other:?}"
            )));
        }
    };
    let mut verb = match decl.kind.as_str() {
        "request" => RawVerb::request(&decl.name, class),
        "notification" => RawVerb::notification(&decl.name, class),
        "stream" => RawVerb::stream(&decl.name, class),
        "task" => RawVerb::task(&decl.name, class),
        other => return Err(value_error(format!("no verb kind {other:?}"))),
    };
    if let Some(s) = schema(&decl.args_schema)? {
        verb = verb.args_schema(&s);
    }
    if let Some(s) = schema(&decl.result_schema)? {
        verb = verb.result_schema(&s);
    }
    let invoke = Arc::new(decl.invoke);
    let bridge = bridge.clone();
    Ok(match decl.kind.as_str() {
        "stream" => cap.handle_raw_stream(
            verb,
            move |args: RawValue, items: Items<RawValue>, from: Sender, meta: Meta| {
                let (bridge, invoke) = (bridge.clone(), Arc::clone(&invoke));
                async move {
                    let items = Arc::new(tokio::sync::Mutex::new(Some(items)));
                    let out = handlers::run(
                        bridge,
                        invoke,
                        args,
                        Extra::Items(Arc::clone(&items)),
                        from,
                        meta,
                    )
                    .await;
                    // The stream ends here, whoever still holds the sink.
                    drop(items.lock().await.take());
                    out.map(drop)
                }
            },
        ),
        "task" => {
            // The args are checked on the loop before the task is written,
            // as a typed task's are decoded before it exists.
            let check = decl.check.map(Arc::new);
            let on_check = bridge.clone();
            let checker = move |args: RawValue, from: Sender, meta: Meta| {
                let (bridge, check) = (on_check.clone(), check.clone());
                async move {
                    match check {
                        Some(check) => handlers::run(bridge, check, args, Extra::None, from, meta)
                            .await
                            .map(drop),
                        None => Ok(()),
                    }
                }
            };
            cap.handle_raw_task_checked(
                verb,
                decl.resumable,
                checker,
                move |args: RawValue, task: Task, from: Sender, meta: Meta| {
                    let (bridge, invoke) = (bridge.clone(), Arc::clone(&invoke));
                    handlers::run(
                        bridge,
                        invoke,
                        args,
                        Extra::Task(Arc::new(task)),
                        from,
                        meta,
                    )
                },
            )
        }
        _ => cap.handle_raw(verb, move |args: RawValue, from: Sender, meta: Meta| {
            let (bridge, invoke) = (bridge.clone(), Arc::clone(&invoke));
            handlers::run(bridge, invoke, args, Extra::None, from, meta)
        }),
    })
}

/// Starts a node; awaitable, on the loop whose handlers will run.
#[pyfunction]
#[pyo3(signature = (app_id, bridge, *, name=None, description=String::new(), listen=Vec::new(), state_dir=None, key_file=None, bound_to=None, contacts=Vec::new(), verbs=Vec::new()))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn start_node<'py>(
    py: Python<'py>,
    app_id: String,
    bridge: Bridge,
    name: Option<String>,
    description: String,
    listen: Vec<String>,
    state_dir: Option<String>,
    key_file: Option<String>,
    bound_to: Option<String>,
    contacts: Vec<(String, String, String)>,
    verbs: Vec<VerbDecl>,
) -> PyResult<Bound<'py, PyAny>> {
    let mut builder = capwire::Node::builder(app_id).description(description);
    if let Some(name) = name {
        builder = builder.name(name);
    }
    for a in &listen {
        builder = builder.listen(addr(a)?);
    }
    if let Some(dir) = state_dir {
        builder = builder.state_dir(dir);
    }
    if let Some(path) = key_file {
        let key =
            capwire::identity::read_key_file(std::path::Path::new(&path)).map_err(value_error)?;
        builder = builder.keypair(key);
    }
    if let Some(id) = bound_to {
        builder = builder.bound_to(node_id(&id)?);
    }
    for (name, id, a) in &contacts {
        builder = builder.contact(Contact {
            name: name.clone(),
            id: node_id(id)?,
            addr: addr(a)?,
        });
    }
    // Verbs of one capability come together, in declaration order.
    let mut caps: Vec<Capability> = Vec::new();
    for decl in verbs {
        let at = caps.iter().position(|c| c.id() == decl.cap);
        let cap = match at {
            Some(i) => caps.remove(i),
            None => Capability::new(&decl.cap, &decl.version)
                .map_err(|e| PyErr::from(errors::node(e)))?,
        };
        let cap = add_verb(cap, decl, &bridge)?;
        caps.insert(at.unwrap_or(caps.len()), cap);
    }
    for cap in caps {
        builder = builder.capability(cap);
    }
    let on_loop = bridge.clone();
    bridge.spawn(py, async move {
        let node = builder.start().await.map_err(errors::node)?;
        Ok(Node::from_rust(node, on_loop))
    })
}

/// A running node.
#[pyclass(frozen, module = "capwire._capwire")]
pub(crate) struct Node {
    node: capwire::Node,
    /// What its peers hold on to it by: weakly, so that a peer kept
    /// after the node is gone does not keep the node's runtime (and its
    /// state directory) alive.
    anchor: Arc<capwire::Node>,
    bridge: Bridge,
    metrics: Arc<Mutex<Vec<MetricsServer>>>,
}

#[pymethods]
impl Node {
    /// The node's id, as hex.
    #[getter]
    fn id(&self) -> String {
        self.node.id().to_string()
    }

    fn local_addrs(&self) -> Vec<String> {
        self.node
            .local_addrs()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    fn manifest(&self) -> PyResult<value::Cbor> {
        Ok(value::serialized(&self.node.manifest())?)
    }

    #[pyo3(signature = (expected=None))]
    fn invite(&self, expected: Option<&str>) -> PyResult<String> {
        let expected = expected.map(node_id).transpose()?;
        self.node
            .invite(expected)
            .map(|i| i.to_string())
            .map_err(|e| PyErr::from(errors::node(e)))
    }

    fn cancel_invite(&self) {
        self.node.cancel_invite();
    }

    fn controller(&self) -> Option<String> {
        self.node.controller().map(|c| c.to_string())
    }

    fn unbind<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let node = self.node.clone();
        self.bridge.spawn(py, async move {
            let was = node.unbind().await.map_err(errors::node)?;
            Ok(was.map(|c| c.to_string()))
        })
    }

    fn config(&self) -> PyResult<value::Cbor> {
        Ok(value::serialized(&self.node.config())?)
    }

    fn watch_config(&self) -> ConfigWatch {
        ConfigWatch {
            watch: Arc::new(tokio::sync::Mutex::new(self.node.watch_config())),
            bridge: self.bridge.clone(),
        }
    }

    #[pyo3(signature = (address, expected=None))]
    fn connect<'py>(
        &self,
        py: Python<'py>,
        address: &str,
        expected: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (address, expected) = (addr(address)?, expected.map(node_id).transpose()?);
        let (node, weak, bridge) = (self.node.clone(), self.weak(), self.bridge.clone());
        self.bridge.spawn(py, async move {
            let peer = node
                .connect(&address, expected)
                .await
                .map_err(errors::node)?;
            Ok(Peer::new(peer, weak, bridge))
        })
    }

    fn connect_invite<'py>(&self, py: Python<'py>, invite: &str) -> PyResult<Bound<'py, PyAny>> {
        let invite: Invite = invite.parse().map_err(value_error)?;
        let (node, weak, bridge) = (self.node.clone(), self.weak(), self.bridge.clone());
        self.bridge.spawn(py, async move {
            let (peer, reply) = node.connect_invite(&invite).await.map_err(errors::node)?;
            let reply = reply.map(|r| value::serialized(&r)).transpose()?;
            Ok((Peer::new(peer, weak, bridge), reply))
        })
    }

    fn peer(&self, id: &str) -> PyResult<Peer> {
        Ok(Peer::new(
            self.node.peer(node_id(id)?),
            self.weak(),
            self.bridge.clone(),
        ))
    }

    #[pyo3(signature = (id, timeout=None))]
    fn wait_for_peer<'py>(
        &self,
        py: Python<'py>,
        id: &str,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (id, timeout) = (node_id(id)?, seconds(timeout)?);
        let (node, weak, bridge) = (self.node.clone(), self.weak(), self.bridge.clone());
        self.bridge.spawn(py, async move {
            let peer = node
                .wait_for_peer(id, timeout)
                .await
                .map_err(errors::node)?;
            Ok(Peer::new(peer, weak, bridge))
        })
    }

    fn connected_peers(&self) -> Vec<String> {
        self.node
            .connected_peers()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// The node's counters in the Prometheus text format.
    fn metrics_text(&self) -> String {
        capwire::prometheus::encode(&self.node)
    }

    /// Serves the node's metrics over HTTP at `address` (`/metrics`); the
    /// address bound.
    fn serve_metrics<'py>(slf: Bound<'py, Self>, address: &str) -> PyResult<Bound<'py, PyAny>> {
        let address: std::net::SocketAddr = address.parse().map_err(value_error)?;
        let this = slf.get();
        let (node, servers) = (this.node.clone(), Arc::clone(&this.metrics));
        this.bridge.spawn(slf.py(), async move {
            let server = MetricsServer::bind(address, node)
                .await
                .map_err(|e| Fail::class("NodeError", e.to_string(), None))?;
            let bound = server.local_addr().to_string();
            servers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(server);
            Ok(bound)
        })
    }

    fn shutdown<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let node = self.node.clone();
        let servers: Vec<MetricsServer> = std::mem::take(
            &mut *self
                .metrics
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        self.bridge.spawn(py, async move {
            for server in servers {
                server.stop();
                server.stopped().await;
            }
            node.shutdown().await;
            Ok(())
        })
    }
}

impl Node {
    pub(crate) fn from_rust(node: capwire::Node, bridge: Bridge) -> Self {
        Self {
            anchor: Arc::new(node.clone()),
            node,
            bridge,
            metrics: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn weak(&self) -> Weak<capwire::Node> {
        Arc::downgrade(&self.anchor)
    }

    pub(crate) fn bridge(&self) -> &Bridge {
        &self.bridge
    }

    pub(crate) fn inner(&self) -> &capwire::Node {
        &self.node
    }
}

/// The node's configuration as it changes.
#[pyclass(frozen, module = "capwire._capwire")]
pub(crate) struct ConfigWatch {
    watch: Arc<tokio::sync::Mutex<capwire::ConfigWatch>>,
    bridge: Bridge,
}

#[pymethods]
impl ConfigWatch {
    fn current(&self) -> PyResult<value::Cbor> {
        let watch = self
            .watch
            .try_lock()
            .map_err(|_| value_error("the watch is being waited on"))?;
        Ok(value::serialized(&watch.current())?)
    }

    /// The next configuration; raises `StopAsyncIteration` when the node
    /// stopped.
    fn changed<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let watch = Arc::clone(&self.watch);
        self.bridge.run_here(py, async move {
            match watch.lock().await.changed().await {
                Some(config) => value::serialized(&config),
                None => Err(Fail::Stop),
            }
        })
    }
}
