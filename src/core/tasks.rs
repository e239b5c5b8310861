//! `core.tasks` (bootstrap, protocol 2): the tasks of a node, for the
//! peer that submitted each and for the node's control plane. Every verb
//! checks, inside, that the caller may see the task: its submitter, or
//! the control plane bound now. Anyone else is told `not_found` in the
//! same words as for a task that does not exist, so ids cannot be probed.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use capwire_envelope::ErrorCode;
use capwire_manifest::{
    ListTasksArgs, RespondArgs, SubscribeArgs, TaskChanged, TaskEvent, TaskInfo, TaskList, TaskRef,
    TasksCancel, TasksChanged, TasksGet, TasksList, TasksRespond, TasksSubscribe,
};
use tokio_util::sync::CancellationToken;

use crate::core::events::ControlEvent;
use crate::core::state::{Core, CoreState};
use crate::dispatch::extract::Tasks;
use crate::dispatch::extract::{Channel, Sender};
use crate::dispatch::handler::{HandlerError, RouteEntry, RouteHandler, StreamTyped, Typed};
use crate::dispatch::items::{Items, StreamClosed};
use crate::tasks::{TaskId, TaskService, wire_event};

/// Tasks in one page of `list`, by default and at most.
const PAGE: u32 = 50;
const MAX_PAGE: u32 = 200;
/// Events read from the store at a time for a subscriber.
const EVENTS_AT_ONCE: usize = 64;
/// Task infos read from the store at a time for a page of `list`.
const INFOS_AT_ONCE: usize = 8;
/// Room kept in an answer for its envelope and the page's `next`.
const ANSWER_SLACK: usize = 512;

fn not_found() -> HandlerError {
    HandlerError::new(ErrorCode::NotFound, "no such task")
}

fn parse(task: &str) -> Result<TaskId, HandlerError> {
    TaskId::parse(task).ok_or_else(|| {
        HandlerError::new(
            ErrorCode::BadArgs,
            "a task id is 32 lowercase hexadecimal digits",
        )
    })
}

/// The info of task `id` if `who` may see it.
async fn info(
    service: &TaskService,
    id: &TaskId,
    who: &capwire_envelope::NodeId,
) -> Result<TaskInfo, HandlerError> {
    let record = service.visible(id, who).ok_or_else(not_found)?;
    let mut infos = service.infos(vec![record]).await?;
    infos.pop().ok_or_else(not_found)
}

async fn get(
    args: TaskRef,
    Sender(who): Sender,
    Tasks(service): Tasks,
) -> Result<TaskInfo, HandlerError> {
    let id = parse(&args.task)?;
    info(&service, &id, &who).await
}

async fn list(
    args: ListTasksArgs,
    Sender(who): Sender,
    Tasks(service): Tasks,
    channel: Channel,
) -> Result<TaskList, HandlerError> {
    let limit = args.limit.unwrap_or(PAGE).clamp(1, MAX_PAGE) as usize;
    let before = match &args.before {
        Some(b) => {
            let id = parse(b)?;
            // A page starts after a task the caller saw: one that is gone
            // (its retention passed) cannot say where, and starting from
            // the top instead would loop.
            if service.visible(&id, &who).is_none() {
                return Err(HandlerError::new(
                    ErrorCode::NotFound,
                    "the task the page starts before is gone; list again from the start",
                ));
            }
            Some(id)
        }
        None => None,
    };
    let (records, mut next) = service.page(&who, before.as_ref(), limit, |r| {
        args.state.is_none_or(|s| r.state == s)
            && args.cap.as_deref().is_none_or(|c| r.cap == c)
            && args.verb.as_deref().is_none_or(|v| r.verb == v)
    });
    // The page ends early where the answer would outgrow what the caller
    // takes in one frame; `next` then starts after the last one kept. The
    // infos (each with up to three bodies) are read a few at a time, and
    // reading stops there: what one answer holds in memory is bounded by
    // the frame, not by `limit` times the largest info.
    let room = channel.reply_room.saturating_sub(ANSWER_SLACK);
    let mut used = 0usize;
    let mut tasks = Vec::new();
    let total = records.len();
    let mut records = records.into_iter();
    'page: loop {
        let chunk: Vec<_> = records.by_ref().take(INFOS_AT_ONCE).collect();
        if chunk.is_empty() {
            break;
        }
        for info in service.infos(chunk).await? {
            let len = capwire_envelope::to_vec(&info).map_or(usize::MAX, |b| b.len());
            if used.saturating_add(len) > room {
                if tasks.is_empty() {
                    // Alone too large for one answer: the page is empty,
                    // and `next` goes on after it (get it alone), so
                    // paging never stops at it.
                    return Ok(TaskList {
                        tasks,
                        next: Some(info.task),
                    });
                }
                break 'page;
            }
            used += len;
            tasks.push(info);
        }
    }
    if tasks.len() < total {
        next = tasks.last().and_then(|i| TaskId::parse(&i.task));
    }
    Ok(TaskList {
        tasks,
        next: next.map(|id| id.to_string()),
    })
}

/// Sends the events of task `id` from `args.from` on, then each new one
/// as it is written, until the task's final event (then the stream ends
/// well), for as long as the caller may see the task: a control plane
/// that is unbound meanwhile gets `not_found` at once, and no event after
/// the unbind.
async fn subscribe(
    args: SubscribeArgs,
    mut items: Items<TaskEvent>,
    Sender(who): Sender,
    Tasks(service): Tasks,
) -> Result<(), HandlerError> {
    let id = parse(&args.task)?;
    let mut next = args.from.unwrap_or(1).max(1);
    // Only a task the caller may see gets a watcher: ids that do not
    // exist leave nothing behind.
    let sight = service.sight(&id, &who)?;
    if let Some(held) = &sight {
        items.hold(held.clone());
    }
    let lost = async {
        match &sight {
            Some(held) => drop(held.lost().await),
            None => std::future::pending().await,
        }
    };
    let mut lost = pin!(lost);
    let watcher = service.watcher(id);
    // Refused for want of sight: the caller is told what it would be told
    // of a task it cannot see.
    let sent = |r: Result<(), StreamClosed>| {
        r.map_err(|e| match e {
            StreamClosed::Unauthorized => not_found(),
            e => HandlerError::from(e),
        })
    };
    loop {
        // Registered before the store is read, so an event written
        // meanwhile wakes this loop.
        let mut woken = pin!(watcher.notified());
        woken.as_mut().enable();
        let record = service.visible(&id, &who).ok_or_else(not_found)?;
        // Folded events are gone: the stream goes on from the oldest kept
        // (the caller sees the gap in the seqs).
        next = next.max(record.first_seq);
        if next <= record.seq {
            let events = service.events(id, next, EVENTS_AT_ONCE).await?;
            let Some(last) = events.last().map(|e| e.seq) else {
                // Folded away between the two reads, or counted by the
                // record and not written yet: look again when something
                // changes, or in a moment (never in a busy loop: a store
                // that lacks the events would keep it spinning).
                tokio::select! {
                    () = &mut woken => {}
                    () = tokio::time::sleep(std::time::Duration::from_millis(10)) => {}
                    () = &mut lost => return Err(not_found()),
                }
                continue;
            };
            for e in events {
                let end = e.state.is_final();
                sent(items.send(wire_event(e)).await)?;
                if end {
                    return Ok(());
                }
            }
            next = last + 1;
            continue;
        }
        if record.state.is_final() {
            return Ok(());
        }
        tokio::select! {
            () = &mut woken => {}
            () = &mut lost => return Err(not_found()),
        }
    }
}

async fn cancel(
    args: TaskRef,
    Sender(who): Sender,
    Tasks(service): Tasks,
) -> Result<TaskInfo, HandlerError> {
    let id = parse(&args.task)?;
    service.visible(&id, &who).ok_or_else(not_found)?;
    service.cancel(id, who).await?;
    info(&service, &id, &who).await
}

async fn respond(
    args: RespondArgs,
    Sender(who): Sender,
    Tasks(service): Tasks,
) -> Result<TaskInfo, HandlerError> {
    let id = parse(&args.task)?;
    service.visible(&id, &who).ok_or_else(not_found)?;
    service
        .respond(id, args.question_seq, args.answer.as_bytes().to_vec())
        .await?;
    info(&service, &id, &who).await
}

/// A push from a node this one controls: handed to the application.
async fn changed(
    change: TaskChanged,
    Sender(from): Sender,
    Core(core): Core,
) -> Result<(), HandlerError> {
    core.push_event(ControlEvent::Task { from, change });
    Ok(())
}

macro_rules! route {
    ($verb:ty, ($($e:ty),+), $f:expr) => {
        Arc::new(RouteEntry::new(Typed::<$verb, ($($e,)+), _>::new($f))) as RouteHandler
    };
}

pub(crate) fn capability() -> capwire_manifest::Capability<RouteHandler> {
    capwire_manifest::Capability::new(
        capwire_manifest::CORE_TASKS,
        capwire_manifest::Version::new(1, 0, 0),
    )
    .verb::<TasksGet>(route!(TasksGet, (Sender, Tasks), get))
    .verb::<TasksList>(route!(TasksList, (Sender, Tasks, Channel), list))
    .verb::<TasksSubscribe>(Arc::new(RouteEntry::new(StreamTyped::<
        TasksSubscribe,
        (Sender, Tasks),
        _,
    >::new(subscribe))) as RouteHandler)
    .verb::<TasksCancel>(route!(TasksCancel, (Sender, Tasks), cancel))
    .verb::<TasksRespond>(route!(TasksRespond, (Sender, Tasks), respond))
    .verb::<TasksChanged>(route!(TasksChanged, (Sender, Core), changed))
}

/// How long one push waits for the control plane's session and for room.
const PUSH_DEADLINE: Duration = Duration::from_secs(10);

/// Pushes the node's task state changes to its bound control plane
/// (`core.tasks/changed`), in order, until `stop`. A push that is not
/// delivered to the control plane bound (it speaks protocol 1, the
/// binding changed, no session or no room within the deadline) is
/// counted in the next one's `dropped`, as are those the full queue left
/// out: a control plane that sees `dropped` above 0 lists. With no
/// control plane bound, there is nobody to tell.
pub(crate) async fn push_loop(
    core: Arc<CoreState>,
    service: Arc<TaskService>,
    stop: CancellationToken,
) {
    loop {
        let binding = core.control.binding();
        let Some(change) = service.next_push(binding.epoch()) else {
            tokio::select! {
                () = stop.cancelled() => return,
                () = service.push_ready() => continue,
            }
        };
        let Some(cp) = binding.controller().copied() else {
            service.unsent();
            continue;
        };
        let peer = core.handle.peer(cp);
        let deadline = tokio::time::Instant::now() + PUSH_DEADLINE;
        let send = async {
            core.handle.wait_any_session(&cp, deadline).await;
            if !peer.speaks_v2() {
                // A version-1 control plane knows no tasks.
                return Ok(false);
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            peer.notify_if(TasksChanged, change.clone(), left, || {
                core.control.binding().epoch() == binding.epoch()
            })
            .await
        };
        tokio::select! {
            () = stop.cancelled() => return,
            sent = send => match sent {
                Ok(true) => {}
                Ok(false) => {
                    tracing::debug!("task push not sent: the binding changed, or the control plane speaks protocol 1");
                    service.undelivered(&change, binding.epoch());
                }
                Err(e) => {
                    tracing::debug!(error = %e, "task push not delivered");
                    service.undelivered(&change, binding.epoch());
                }
            }
        }
    }
}
