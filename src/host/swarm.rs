//! The container host in Swarm mode: each child is a Swarm service of one
//! replica (its restart condition, resources, placement constraints and
//! labels from its placement), its state on a named volume of the node
//! that runs it. The parent attaches to the service's running container
//! on the engine it speaks to, as the container host does; Swarm starts a
//! new container when one fails, and the parent attaches to that one.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bollard::Docker;
use bollard::models::{
    Limit, Mount, MountTmpfsOptions, MountType, MountVolumeOptions, NetworkAttachmentConfig,
    ServiceSpec, ServiceSpecMode, ServiceSpecModeReplicated, TaskSpec, TaskSpecContainerSpec,
    TaskSpecContainerSpecPrivileges, TaskSpecPlacement, TaskSpecResources, TaskSpecRestartPolicy,
    TaskSpecRestartPolicyConditionEnum,
};
use bollard::query_parameters::{
    ListContainersOptions, ListServicesOptions, ListTasksOptions, ListVolumesOptions,
};
use capwire_envelope::NodeId;
use capwire_manifest::RunState;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::contact::Contact;
use crate::host::docker::remove_volume;
use crate::host::engine::{
    EngineConfig, LABEL_CID, LABEL_PARENT, Names, Network, STATE_DIR, Shared, check_placement,
    effective, engine_error, labels, listen_addr, node_args, run_of, status_of,
};
use crate::host::pipe::{failed, lock};
use crate::host::{ChildInfo, ChildSpec, Host, HostError, HostEvent, HostFuture};
use crate::invite::Invite;

/// The label Swarm puts on a service's containers.
const SERVICE_LABEL: &str = "com.docker.swarm.service.name";
/// How long Swarm waits before it starts a failed child again.
const RESTART_DELAY_NS: i64 = 200_000_000;

/// Runs children as Swarm services (needs the `docker` feature and an
/// engine that is a swarm manager).
///
/// ```no_run
/// use capwire::host::{EngineConfig, SwarmHost};
/// use capwire::Node;
/// # async fn run() -> Result<(), capwire::NodeError> {
/// let host = SwarmHost::new(EngineConfig::default());
/// let node = Node::builder("parent").host(host).start().await?;
/// # Ok(()) }
/// ```
pub struct SwarmHost {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SwarmHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwarmHost")
            .field("config", &self.shared.cfg)
            .field("children", &lock(&self.shared.kids).len())
            .finish_non_exhaustive()
    }
}

fn by_label(key: &str, value: &str) -> HashMap<String, Vec<String>> {
    HashMap::from([("label".to_owned(), vec![format!("{key}={value}")])])
}

impl SwarmHost {
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

    fn watch(&self, docker: &Docker, parent: NodeId) {
        if self.shared.watching.set(()).is_ok() {
            tokio::spawn(watch(Arc::downgrade(&self.shared), docker.clone(), parent));
        }
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
        let made = match docker.inspect_service(&names.workload, None).await {
            Ok(_) => false,
            Err(e) if status_of(&e) == Some(404) => {
                make(shared, &docker, &spec, &parent, &names).await?;
                true
            }
            Err(e) => return Err(engine_error("looking for the child's service", &e)),
        };
        let attached = async {
            let id = running_container(&docker, &names, shared.cfg.ready_timeout).await?;
            shared.attach(&spec.cid, &names, &id).await
        };
        match attached.await {
            Ok(info) => Ok(info),
            Err(e) if made => {
                let _ = remove(&docker, &names).await;
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    async fn stop_child(&self, cid: &str) -> Result<(), HostError> {
        let Some(names) = self.shared.names(cid) else {
            return Ok(());
        };
        lock(&self.shared.stopping).insert(cid.to_owned());
        self.shared.forget(cid);
        let docker = self.shared.docker().await?;
        remove(&docker, &names).await
    }

    async fn retain_only(&self, parent: NodeId, keep: Vec<String>) -> Result<(), HostError> {
        let _ = self.shared.parent.set(parent);
        let docker = self.shared.docker().await?;
        self.watch(&docker, parent);
        let filters = by_label(LABEL_PARENT, &parent.to_string());
        let services = docker
            .list_services(Some(ListServicesOptions {
                filters: Some(filters.clone()),
                ..ListServicesOptions::default()
            }))
            .await
            .map_err(|e| engine_error("listing the children's services", &e))?;
        let volumes = docker
            .list_volumes(Some(ListVolumesOptions {
                filters: Some(filters),
            }))
            .await
            .map_err(|e| engine_error("listing the children's volumes", &e))?;
        let mut cids: Vec<String> = services
            .iter()
            .filter_map(|s| s.spec.as_ref()?.labels.as_ref()?.get(LABEL_CID).cloned())
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
            tracing::info!(cid = %cid, "removing a service the roster no longer has");
            self.shared.forget(&cid);
            remove(&docker, &Names::of(&self.shared.cfg.prefix, &parent, &cid)).await?;
        }
        Ok(())
    }
}

/// Makes the child's service.
async fn make(
    shared: &Shared,
    docker: &Docker,
    spec: &ChildSpec,
    parent: &NodeId,
    names: &Names,
) -> Result<(), HostError> {
    let cfg = &shared.cfg;
    let p = effective(cfg, &spec.placement);
    let image = p.image.clone().unwrap_or_else(|| cfg.image.clone());
    crate::host::image::require(docker, &image).await?;
    let (listen, _port) = listen_addr(cfg, spec)?;
    let labels = labels(spec, parent);
    let network = match &cfg.network {
        Network::Host { .. } => "host".to_owned(),
        Network::Published { network, .. } => network.clone(),
    };
    let container = TaskSpecContainerSpec {
        image: Some(image),
        args: Some(node_args(cfg, spec, &listen)),
        user: Some(cfg.user.clone()),
        labels: Some(labels.clone()),
        open_stdin: Some(true),
        tty: Some(false),
        read_only: Some(true),
        capability_drop: Some(vec!["ALL".to_owned()]),
        privileges: Some(TaskSpecContainerSpecPrivileges {
            no_new_privileges: Some(true),
            ..TaskSpecContainerSpecPrivileges::default()
        }),
        mounts: Some(vec![
            Mount {
                target: Some(STATE_DIR.to_owned()),
                source: Some(names.volume.clone()),
                typ: Some(MountType::VOLUME),
                volume_options: Some(MountVolumeOptions {
                    labels: Some(labels.clone()),
                    ..MountVolumeOptions::default()
                }),
                ..Mount::default()
            },
            Mount {
                target: Some("/tmp".to_owned()),
                typ: Some(MountType::TMPFS),
                tmpfs_options: Some(MountTmpfsOptions {
                    size_bytes: Some(16 << 20),
                    ..MountTmpfsOptions::default()
                }),
                ..Mount::default()
            },
        ]),
        ..TaskSpecContainerSpec::default()
    };
    let service = ServiceSpec {
        name: Some(names.workload.clone()),
        labels: Some(labels),
        mode: Some(ServiceSpecMode {
            replicated: Some(ServiceSpecModeReplicated { replicas: Some(1) }),
            ..ServiceSpecMode::default()
        }),
        task_template: Some(TaskSpec {
            container_spec: Some(container),
            resources: Some(TaskSpecResources {
                limits: Some(Limit {
                    nano_cpus: p
                        .cpus_milli
                        .and_then(|c| i64::try_from(c.saturating_mul(1_000_000)).ok()),
                    memory_bytes: p.memory.and_then(|m| i64::try_from(m).ok()),
                    pids: p.pids.and_then(|n| i64::try_from(n).ok()),
                }),
                ..TaskSpecResources::default()
            }),
            // Bounded, as the container host's (Swarm reads 0 attempts as
            // "for ever": that is condition "none").
            restart_policy: Some(match p.restarts.unwrap_or(0) {
                0 => TaskSpecRestartPolicy {
                    condition: Some(TaskSpecRestartPolicyConditionEnum::NONE),
                    ..TaskSpecRestartPolicy::default()
                },
                n => TaskSpecRestartPolicy {
                    condition: Some(TaskSpecRestartPolicyConditionEnum::ON_FAILURE),
                    delay: Some(RESTART_DELAY_NS),
                    max_attempts: Some(i64::from(n)),
                    window: None,
                },
            }),
            placement: Some(TaskSpecPlacement {
                constraints: (!p.constraints.is_empty()).then(|| p.constraints.clone()),
                ..TaskSpecPlacement::default()
            }),
            networks: Some(vec![NetworkAttachmentConfig {
                target: Some(network),
                ..NetworkAttachmentConfig::default()
            }]),
            ..TaskSpec::default()
        }),
        ..ServiceSpec::default()
    };
    docker
        .create_service(service, None)
        .await
        .map_err(|e| engine_error("making the child's service", &e))?;
    Ok(())
}

/// The id of the service's running container on this engine, once there
/// is one.
async fn running_container(
    docker: &Docker,
    names: &Names,
    within: Duration,
) -> Result<String, HostError> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let found = docker
            .list_containers(Some(ListContainersOptions {
                filters: Some(by_label(SERVICE_LABEL, &names.workload)),
                ..ListContainersOptions::default()
            }))
            .await
            .map_err(|e| engine_error("looking for the service's container", &e))?;
        if let Some(id) = found.into_iter().find_map(|c| c.id) {
            return Ok(id);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(failed(format!(
                "the child's service has no running container on this engine within {within:?} \
                 (is its image on the node Swarm placed it on?)"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Removes the child's service, waits for its containers to go, then
/// removes its state volume.
async fn remove(docker: &Docker, names: &Names) -> Result<(), HostError> {
    match docker.delete_service(&names.workload).await {
        Ok(()) => {}
        Err(e) if status_of(&e) == Some(404) => {}
        Err(e) => return Err(engine_error("removing the child's service", &e)),
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let left = docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(by_label(SERVICE_LABEL, &names.workload)),
                ..ListContainersOptions::default()
            }))
            .await
            .map_err(|e| engine_error("looking for the service's containers", &e))?;
        if left.is_empty() || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    remove_volume(docker, &names.volume).await
}

/// How often Swarm started the service's task again, and whether it will
/// start it again now.
async fn restarts_of(docker: &Docker, service: &str) -> (u64, bool) {
    let tasks = docker
        .list_tasks(Some(ListTasksOptions {
            filters: Some(HashMap::from([(
                "service".to_owned(),
                vec![service.to_owned()],
            )])),
        }))
        .await
        .unwrap_or_default();
    let restarts = u64::try_from(tasks.len().saturating_sub(1)).unwrap_or(0);
    let max = docker
        .inspect_service(service, None)
        .await
        .ok()
        .and_then(|s| s.spec?.task_template?.restart_policy?.max_attempts)
        .and_then(|m| u64::try_from(m).ok())
        .unwrap_or(0);
    (restarts, restarts < max)
}

/// The engine's events for this parent's task containers, as the
/// children's runs.
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
            let Some(names) = shared.names(&cid) else {
                continue;
            };
            match event.action.as_deref() {
                Some("die") => {
                    let inspected = docker.inspect_container(&id, None).await.ok();
                    let (restarts, again) = restarts_of(&docker, &names.workload).await;
                    let run = run_of(
                        inspected.as_ref().and_then(|c| c.state.as_ref()),
                        restarts,
                        again,
                    );
                    shared.report(&cid, run, None).await;
                }
                Some("start") => {
                    let shared = shared.clone();
                    let docker = docker.clone();
                    tokio::spawn(async move {
                        let old = lock(&shared.kids).get(&cid).and_then(|k| k.session.clone());
                        if let Some(old) = old {
                            let _ = tokio::time::timeout(
                                Duration::from_secs(2),
                                old.reaped.cancelled(),
                            )
                            .await;
                        }
                        let (restarts, _) = restarts_of(&docker, &names.workload).await;
                        match shared.attach(&cid, &names, &id).await {
                            Ok(info) => {
                                let run = crate::host::ChildRun {
                                    state: RunState::Running,
                                    exit_code: None,
                                    oom_killed: false,
                                    restarts,
                                    detail: format!("running again after {restarts} restart(s)"),
                                };
                                shared.report(&cid, run, Some(info)).await;
                            }
                            Err(e) => {
                                tracing::warn!(cid = %cid, error = %e, "a restarted child did not answer");
                            }
                        }
                    });
                }
                _ => {}
            }
        }
        if shared.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

impl Host for SwarmHost {
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
        self.shared.detach_all();
        Box::pin(async { Ok(()) })
    }
}
