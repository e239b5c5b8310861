//! The container host: each child is a Docker container running `capwire
//! node --supervised` from a local image, with its state on a named
//! volume, its limits, a read-only root, no capabilities, no new
//! privileges, a non-root user and a bounded restart policy. The parent
//! speaks to it over the engine's attach stream (the process host's pipe
//! protocol), never over the network.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bollard::Docker;
use bollard::models::{
    ContainerCreateBody, HostConfig, Mount, MountType, PortBinding, RestartPolicy,
    RestartPolicyNameEnum, VolumeCreateRequest,
};
use bollard::query_parameters::{
    CreateContainerOptions, ListContainersOptions, ListVolumesOptions, RemoveContainerOptions,
    RemoveVolumeOptions, StopContainerOptions,
};
use capwire_envelope::NodeId;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::contact::Contact;
use crate::host::engine::{
    EngineConfig, LABEL_CID, LABEL_PARENT, Names, Network, STATE_DIR, Shared, check_placement,
    effective, engine_error, labels, listen_addr, node_args, run_of, status_of,
};
use crate::host::pipe::lock;
use crate::host::{ChildInfo, ChildSpec, Host, HostError, HostEvent, HostFuture};
use crate::invite::Invite;

/// Runs children as Docker containers (needs the `docker` feature).
///
/// ```no_run
/// use capwire::host::{DockerHost, EngineConfig};
/// use capwire::Node;
/// # async fn run() -> Result<(), capwire::NodeError> {
/// // Children from the local image `capwire:latest` (`capwire image
/// // build`), on loopback ports of the host's network.
/// let host = DockerHost::new(EngineConfig::default());
/// let node = Node::builder("parent").host(host).start().await?;
/// # Ok(()) }
/// ```
pub struct DockerHost {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for DockerHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerHost")
            .field("config", &self.shared.cfg)
            .field("children", &lock(&self.shared.kids).len())
            .finish_non_exhaustive()
    }
}

/// How long a stopped container may take to exit before it is killed.
const STOP_GRACE_SECS: i32 = 2;

fn not_found(e: &bollard::errors::Error) -> bool {
    status_of(e) == Some(404)
}

impl DockerHost {
    /// A host with these settings; nothing is asked of the engine until
    /// the first child.
    pub fn new(config: EngineConfig) -> Self {
        Self {
            shared: Arc::new(Shared::new(config)),
        }
    }

    /// The host's settings.
    pub fn config(&self) -> &EngineConfig {
        &self.shared.cfg
    }

    async fn start_child(&self, spec: ChildSpec) -> Result<ChildInfo, HostError> {
        let shared = &self.shared;
        check_placement(&shared.cfg, &spec)?;
        let parent = shared.parent_of(&spec)?;
        let attached = lock(&shared.kids)
            .get(&spec.cid)
            .filter(|k| k.session.as_ref().is_some_and(|p| !p.reaped.is_cancelled()))
            .and_then(|k| k.info.clone());
        if let Some(info) = attached {
            return Ok(info);
        }
        let docker = shared.docker().await?;
        self.watch(&docker, parent);
        lock(&shared.stopping).remove(&spec.cid);
        let names = Names::of(&shared.cfg.prefix, &parent, &spec.cid);
        let id = match docker.inspect_container(&names.workload, None).await {
            // Adopted: found by its name (and labels), started if it stopped.
            Ok(c) => {
                let id = c.id.unwrap_or_else(|| names.workload.clone());
                if !c.state.and_then(|s| s.running).unwrap_or(false) {
                    docker
                        .start_container(&id, None)
                        .await
                        .map_err(|e| engine_error("starting the child's container", &e))?;
                }
                id
            }
            Err(e) if not_found(&e) => make(shared, &docker, &spec, &parent, &names).await?,
            Err(e) => return Err(engine_error("looking for the child's container", &e)),
        };
        shared.attach(&spec.cid, &names, &id).await
    }

    /// Watches the engine's events for this parent's containers, once.
    fn watch(&self, docker: &Docker, parent: NodeId) {
        if self.shared.watching.set(()).is_ok() {
            tokio::spawn(watch(Arc::downgrade(&self.shared), docker.clone(), parent));
        }
    }

    async fn stop_child(&self, cid: &str) -> Result<(), HostError> {
        let shared = &self.shared;
        let Some(names) = shared.names(cid) else {
            // No parent known: nothing was made by this host.
            return Ok(());
        };
        lock(&shared.stopping).insert(cid.to_owned());
        shared.forget(cid);
        let docker = shared.docker().await?;
        remove(&docker, &names).await
    }

    async fn retain_only(&self, parent: NodeId, keep: Vec<String>) -> Result<(), HostError> {
        let _ = self.shared.parent.set(parent);
        let docker = self.shared.docker().await?;
        self.watch(&docker, parent);
        let filters =
            HashMap::from([("label".to_owned(), vec![format!("{LABEL_PARENT}={parent}")])]);
        let containers = docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(filters.clone()),
                ..ListContainersOptions::default()
            }))
            .await
            .map_err(|e| engine_error("listing the children's containers", &e))?;
        let volumes = docker
            .list_volumes(Some(ListVolumesOptions {
                filters: Some(filters),
            }))
            .await
            .map_err(|e| engine_error("listing the children's volumes", &e))?;
        let mut cids: Vec<String> = containers
            .iter()
            .filter_map(|c| c.labels.as_ref()?.get(LABEL_CID).cloned())
            .chain(
                volumes
                    .volumes
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|v| v.labels.get(LABEL_CID).cloned()),
            )
            .filter(|cid| !keep.contains(cid))
            .collect();
        cids.sort();
        cids.dedup();
        for cid in cids {
            tracing::info!(cid = %cid, "removing a container the roster no longer has");
            self.shared.forget(&cid);
            remove(&docker, &Names::of(&self.shared.cfg.prefix, &parent, &cid)).await?;
        }
        Ok(())
    }
}

/// Makes the child's volume (unless it has one) and container, and
/// starts it; on a failure, removes what it made.
async fn make(
    shared: &Shared,
    docker: &Docker,
    spec: &ChildSpec,
    parent: &NodeId,
    names: &Names,
) -> Result<String, HostError> {
    let cfg = &shared.cfg;
    let p = effective(cfg, &spec.placement);
    let image = p.image.clone().unwrap_or_else(|| cfg.image.clone());
    crate::host::image::require(docker, &image).await?;
    let (listen, port) = listen_addr(cfg, spec)?;
    let labels = labels(spec, parent);
    let new_volume = match docker.inspect_volume(&names.volume).await {
        Ok(_) => false,
        Err(e) if not_found(&e) => {
            docker
                .create_volume(VolumeCreateRequest {
                    name: Some(names.volume.clone()),
                    labels: Some(labels.clone()),
                    ..VolumeCreateRequest::default()
                })
                .await
                .map_err(|e| engine_error("making the child's state volume", &e))?;
            true
        }
        Err(e) => return Err(engine_error("looking for the child's state volume", &e)),
    };
    let undo = |e: HostError| async move {
        let _ = docker
            .remove_container(
                &names.workload,
                Some(RemoveContainerOptions {
                    force: true,
                    ..RemoveContainerOptions::default()
                }),
            )
            .await;
        if new_volume {
            let _ = docker
                .remove_volume(&names.volume, None::<RemoveVolumeOptions>)
                .await;
        }
        e
    };
    let memory = p.memory.and_then(|m| i64::try_from(m).ok());
    let (network_mode, port_bindings, exposed) = match &cfg.network {
        Network::Host { .. } => ("host".to_owned(), None, None),
        Network::Published { network, advertise } => {
            let key = format!("{port}/tcp");
            let binding = PortBinding {
                host_ip: Some(advertise.to_string()),
                host_port: Some(port.to_string()),
            };
            (
                network.clone(),
                Some(HashMap::from([(key.clone(), Some(vec![binding]))])),
                Some(vec![key]),
            )
        }
    };
    let host_config = HostConfig {
        memory,
        // No swap beyond the memory limit: going over it is an OOM kill.
        memory_swap: memory,
        nano_cpus: p
            .cpus_milli
            .and_then(|c| i64::try_from(c.saturating_mul(1_000_000)).ok()),
        pids_limit: p.pids.and_then(|n| i64::try_from(n).ok()),
        readonly_rootfs: Some(true),
        security_opt: Some(vec!["no-new-privileges".to_owned()]),
        cap_drop: Some(vec!["ALL".to_owned()]),
        // Bounded: a child that keeps failing ends up exited and reported
        // (the engine reads a count of 0 as "for ever": that is "no").
        restart_policy: Some(match p.restarts.unwrap_or(0) {
            0 => RestartPolicy {
                name: Some(RestartPolicyNameEnum::NO),
                maximum_retry_count: None,
            },
            n => RestartPolicy {
                name: Some(RestartPolicyNameEnum::ON_FAILURE),
                maximum_retry_count: Some(i64::from(n)),
            },
        }),
        network_mode: Some(network_mode),
        port_bindings,
        mounts: Some(vec![Mount {
            target: Some(STATE_DIR.to_owned()),
            source: Some(names.volume.clone()),
            typ: Some(MountType::VOLUME),
            ..Mount::default()
        }]),
        tmpfs: Some(HashMap::from([(
            "/tmp".to_owned(),
            "rw,noexec,nosuid,size=16m".to_owned(),
        )])),
        ..HostConfig::default()
    };
    let body = ContainerCreateBody {
        image: Some(image),
        cmd: Some(node_args(cfg, spec, &listen)),
        user: Some(cfg.user.clone()),
        labels: Some(labels),
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        open_stdin: Some(true),
        // The child's input stays open when the parent detaches: it runs
        // on, to be adopted by the parent's next run.
        stdin_once: Some(false),
        tty: Some(false),
        exposed_ports: exposed,
        host_config: Some(host_config),
        ..ContainerCreateBody::default()
    };
    let options = CreateContainerOptions {
        name: Some(names.workload.clone()),
        ..CreateContainerOptions::default()
    };
    let id = match docker.create_container(Some(options), body).await {
        Ok(r) => r.id,
        Err(e) => return Err(undo(engine_error("making the child's container", &e)).await),
    };
    if let Err(e) = docker.start_container(&id, None).await {
        return Err(undo(engine_error("starting the child's container", &e)).await);
    }
    Ok(id)
}

/// Stops and removes the child's container and its state volume; what is
/// already gone is removed.
async fn remove(docker: &Docker, names: &Names) -> Result<(), HostError> {
    let stopped = docker
        .stop_container(
            &names.workload,
            Some(StopContainerOptions {
                t: Some(STOP_GRACE_SECS),
                ..StopContainerOptions::default()
            }),
        )
        .await;
    match stopped {
        Ok(()) => {}
        Err(e) if not_found(&e) || status_of(&e) == Some(304) => {}
        Err(e) => return Err(engine_error("stopping the child's container", &e)),
    }
    let removed = docker
        .remove_container(
            &names.workload,
            Some(RemoveContainerOptions {
                force: true,
                ..RemoveContainerOptions::default()
            }),
        )
        .await;
    match removed {
        Ok(()) => {}
        Err(e) if not_found(&e) => {}
        // Already being removed (a race with the engine): done.
        Err(e) if status_of(&e) == Some(409) => {}
        Err(e) => return Err(engine_error("removing the child's container", &e)),
    }
    remove_volume(docker, &names.volume).await
}

/// Removes a state volume; one still held by a container being removed
/// is tried again for a while.
pub(crate) async fn remove_volume(docker: &Docker, volume: &str) -> Result<(), HostError> {
    let mut tries = 0;
    loop {
        match docker
            .remove_volume(volume, None::<RemoveVolumeOptions>)
            .await
        {
            Ok(()) => return Ok(()),
            Err(e) if not_found(&e) => return Ok(()),
            Err(e) if status_of(&e) == Some(409) && tries < 50 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(engine_error("removing the child's state volume", &e)),
        }
    }
}

/// Turns the engine's events for this parent's containers into the
/// children's runs: an exit (with its code, an OOM kill, whether the
/// restart policy starts it again), a start (attached again, the child
/// says how to reach it).
async fn watch(shared: Weak<Shared>, docker: Docker, parent: NodeId) {
    loop {
        let mut events = Box::pin(Shared::events_for(&docker, &parent));
        while let Some(event) = events.next().await {
            let Ok(event) = event else { break };
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let Some(actor) = event.actor else { continue };
            let Some(id) = actor.id else { continue };
            let Some(cid) = actor.attributes.and_then(|mut a| a.remove(LABEL_CID)) else {
                continue;
            };
            let known = lock(&shared.kids).contains_key(&cid);
            if !known || lock(&shared.stopping).contains(&cid) {
                continue;
            }
            match event.action.as_deref() {
                Some("die") => {
                    let inspected = docker.inspect_container(&id, None).await.ok();
                    let restarts = inspected
                        .as_ref()
                        .and_then(|c| c.restart_count)
                        .and_then(|n| u64::try_from(n).ok())
                        .unwrap_or(0);
                    let run = run_of(
                        inspected.as_ref().and_then(|c| c.state.as_ref()),
                        restarts,
                        false,
                    );
                    shared.report(&cid, run, None).await;
                }
                Some("start") => {
                    let shared = shared.clone();
                    let docker = docker.clone();
                    tokio::spawn(async move { restarted(&shared, &docker, &cid, &id).await });
                }
                _ => {}
            }
        }
        if shared.strong_count() == 0 {
            return;
        }
        // The stream ended (the engine restarted?): watch again.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A child's container started again (its restart policy, or by hand):
/// attach to it and report it running, with how to reach it.
async fn restarted(shared: &Arc<Shared>, docker: &Docker, cid: &str, id: &str) {
    // The earlier session ends with the earlier run.
    let old = lock(&shared.kids).get(cid).and_then(|k| k.session.clone());
    if let Some(old) = old {
        let _ = tokio::time::timeout(Duration::from_secs(2), old.reaped.cancelled()).await;
    }
    let Some(names) = shared.names(cid) else {
        return;
    };
    let inspected = docker.inspect_container(id, None).await.ok();
    let restarts = inspected
        .as_ref()
        .and_then(|c| c.restart_count)
        .and_then(|n| u64::try_from(n).ok())
        .unwrap_or(0);
    match shared.attach(cid, &names, id).await {
        Ok(info) => {
            let mut run = run_of(
                inspected.as_ref().and_then(|c| c.state.as_ref()),
                restarts,
                false,
            );
            run.state = capwire_manifest::RunState::Running;
            run.exit_code = None;
            run.oom_killed = false;
            run.detail = format!("running again after {restarts} restart(s)");
            shared.report(cid, run, Some(info)).await;
        }
        Err(e) => tracing::warn!(cid = %cid, error = %e, "a restarted child did not answer"),
    }
}

impl Host for DockerHost {
    fn check(&self, spec: &ChildSpec) -> Result<(), HostError> {
        check_placement(&self.shared.cfg, spec)
    }

    fn start(&self, spec: ChildSpec) -> HostFuture<'_, ChildInfo> {
        Box::pin(self.start_child(spec))
    }

    fn stop(&self, cid: &str) -> HostFuture<'_, ()> {
        let cid = cid.to_owned();
        Box::pin(async move { self.stop_child(&cid).await })
    }

    fn open_bind(&self, cid: &str, controller: NodeId) -> HostFuture<'_, Invite> {
        let cid = cid.to_owned();
        Box::pin(async move { self.shared.open_bind(&cid, controller).await })
    }

    fn close_bind(&self, cid: &str) -> HostFuture<'_, ()> {
        let cid = cid.to_owned();
        Box::pin(async move { self.shared.close_bind(&cid).await })
    }

    fn add_contact(&self, cid: &str, contact: Contact) -> HostFuture<'_, ()> {
        let cid = cid.to_owned();
        Box::pin(async move { self.shared.add_contact(&cid, contact).await })
    }

    fn retain(&self, parent: NodeId, keep: Vec<String>) -> HostFuture<'_, ()> {
        Box::pin(self.retain_only(parent, keep))
    }

    fn events(&self) -> Option<mpsc::Receiver<HostEvent>> {
        lock(&self.shared.events_rx).take()
    }

    fn shutdown(&self) -> HostFuture<'_, ()> {
        // The containers run on (their restart policy keeps them); the
        // parent's next run adopts them.
        self.shared.detach_all();
        Box::pin(async { Ok(()) })
    }
}
