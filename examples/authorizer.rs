//! A custom authorizer next to a bootstrap verb.
//!
//! The node serves `app.store`:
//! - `status` (bootstrap): how many keys it holds; any peer may ask;
//! - `get` and `put` (controller): for the bound control plane;
//! - `wipe` (controller): for the bound control plane, and only while the
//!   node's operator has opened a maintenance window.
//!
//! The node's [`Authorizer`] decides the last two rules. The chokepoint
//! asks it only about controller verbs, and only once the sender is known
//! to be the bound control plane, so an authorizer narrows what the control
//! plane may do and can never widen it to anyone else. An authorizer that
//! errors or panics denies the call.
//!
//! ```text
//!  envelope ─► class of (cap, verb) ─ bootstrap ──────────────────────► handler
//!                   │ controller
//!                   └─► sender is the bound control plane? ─ no ─► unauthorized
//!                            │ yes
//!                            └─► MaintenanceWindow::authorize ─ no ─► unauthorized
//!                                         │ yes
//!                                         └──────────────────────────► handler
//! ```
//!
//! Run with `cargo run --example authorizer`; it prints each call and its
//! outcome, and exits with an error if any outcome is not the expected one.
use std::collections::BTreeMap;
use std::error::Error;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use capwire::authz::{Authorizer, AuthzError, Binding};
use capwire::envelope::ErrorCode;
use capwire::manifest::verb;
use capwire::{CallError, Capability, HandlerError, JsonSchema, Node, NodeId, Sender, State};
use serde::{Deserialize, Serialize};

/// The arguments of `put`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "capwire::schemars")]
struct Entry {
    key: String,
    value: String,
}

verb! { /** How many keys the store holds; any peer may ask. */ struct Status: request "app.store" / "status", Bootstrap, () => u64; }
verb! { /** Reads a key. */ struct Get: request "app.store" / "get", Controller, String => Option<String>; }
verb! { /** Writes a key. */ struct Put: request "app.store" / "put", Controller, Entry => (); }
verb! { /** Deletes every key; answers how many there were. */ struct Wipe: request "app.store" / "wipe", Controller, () => u64; }

/// The node's data, shared with the handlers through [`State`].
type Store = Arc<Mutex<BTreeMap<String, String>>>;

fn lock(store: &Store) -> MutexGuard<'_, BTreeMap<String, String>> {
    store.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The first hex digits of a node id, enough to tell nodes apart here.
fn short(id: &NodeId) -> String {
    id.to_string().chars().take(8).collect()
}

/// Lets the bound control plane read and write at any time and wipe only
/// while the maintenance window is open; the `core.*` controller verbs
/// (unbinding, configuration, cluster) stay allowed as by default.
///
/// It runs on the connection's task, before the handler: it must decide
/// quickly, without I/O or waiting on locks (here: two atomics).
#[derive(Default)]
struct MaintenanceWindow {
    open: AtomicBool,
    asked: AtomicU64,
}

impl Authorizer for MaintenanceWindow {
    fn authorize(
        &self,
        sender: &NodeId,
        cap: &str,
        verb: &str,
        binding: &Binding,
    ) -> Result<bool, AuthzError> {
        self.asked.fetch_add(1, Ordering::Relaxed);
        // The gate has checked this already; checking again costs nothing.
        if !binding.is_controller(sender) {
            return Ok(false);
        }
        // Exact bytes, like the chokepoint itself; anything unlisted is refused.
        let allowed = match (cap, verb) {
            ("app.store", "get" | "put") => true,
            ("app.store", "wipe") => self.open.load(Ordering::Acquire),
            (cap, _) => cap.starts_with("core."),
        };
        let answer = if allowed { "allows" } else { "refuses" };
        println!("    authorizer {answer} {cap}/{verb} for {}", short(sender));
        Ok(allowed)
    }
}

async fn status(
    _: (),
    Sender(from): Sender,
    State(store): State<Store>,
) -> Result<u64, HandlerError> {
    println!("    status handler runs for {}", short(&from));
    Ok(lock(&store).len() as u64)
}

async fn get(key: String, State(store): State<Store>) -> Result<Option<String>, HandlerError> {
    Ok(lock(&store).get(&key).cloned())
}

async fn put(entry: Entry, State(store): State<Store>) -> Result<(), HandlerError> {
    lock(&store).insert(entry.key, entry.value);
    Ok(())
}

async fn wipe(_: (), State(store): State<Store>) -> Result<u64, HandlerError> {
    let mut store = lock(&store);
    let n = store.len() as u64;
    store.clear();
    Ok(n)
}

/// Prints a call that must succeed, and returns its result.
fn allowed<T: std::fmt::Debug>(
    what: &str,
    result: Result<T, CallError>,
) -> Result<T, Box<dyn Error>> {
    match result {
        Ok(value) => {
            println!("{what}: ok, {value:?}");
            Ok(value)
        }
        Err(e) => Err(format!("{what}: expected an answer, got: {e}").into()),
    }
}

/// Prints a call that the node must refuse with `unauthorized`.
fn refused<T: std::fmt::Debug>(
    what: &str,
    result: Result<T, CallError>,
) -> Result<(), Box<dyn Error>> {
    match result {
        Err(e) if e.code() == Some(&ErrorCode::Unauthorized) => {
            println!("{what}: refused, {e}");
            Ok(())
        }
        other => Err(format!("{what}: expected unauthorized, got: {other:?}").into()),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let store = Store::default();
    let window = Arc::new(MaintenanceWindow::default());
    let cap = Capability::new("app.store", "1.0.0")?
        .handle(Status, status)
        .handle(Get, get)
        .handle(Put, put)
        .handle(Wipe, wipe);
    let node = Node::builder("store")
        .listen("127.0.0.1:0".parse()?)
        .capability(cap)
        .state(store)
        .authorizer(window.clone())
        .start()
        .await?;

    // The control plane binds the node with an invite only its key may use.
    let control_plane = Node::builder("control-plane").start().await?;
    let (admin, _) = control_plane
        .connect_invite(&node.invite(Some(control_plane.id()))?)
        .await?;
    println!(
        "node {} is bound to control plane {}",
        short(&node.id()),
        short(&control_plane.id())
    );
    // Any other peer the contact policy admits.
    let visitor = Node::builder("visitor").start().await?;
    let guest = visitor
        .connect(&node.local_addrs()[0], Some(node.id()))
        .await?;
    println!("visitor {} connected\n", short(&visitor.id()));

    allowed("visitor: status", guest.request(Status, ()).await)?;
    let entry = |value: &str| Entry {
        key: "motd".into(),
        value: value.into(),
    };
    refused("visitor: put", guest.request(Put, entry("defaced")).await)?;
    allowed(
        "control plane: put",
        admin.request(Put, entry("hello")).await,
    )?;
    allowed(
        "control plane: get",
        admin.request(Get, "motd".into()).await,
    )?;
    refused("control plane: wipe", admin.request(Wipe, ()).await)?;

    window.open.store(true, Ordering::Release);
    println!("operator: maintenance window opened");
    allowed("control plane: wipe", admin.request(Wipe, ()).await)?;
    allowed("visitor: status", guest.request(Status, ()).await)?;

    // Four controller calls by the control plane; never the visitor's.
    let asked = window.asked.load(Ordering::Relaxed);
    println!("\nthe authorizer was asked {asked} times");
    if asked != 4 {
        return Err(format!("expected 4 questions to the authorizer, not {asked}").into());
    }

    visitor.shutdown().await;
    control_plane.shutdown().await;
    node.shutdown().await;
    Ok(())
}
