//! Tasks from the caller's side: the [`TaskHandle`] that
//! [`Peer::submit`](crate::Peer::submit) returns (`core.tasks` on the
//! peer), and the subscription to a task's events ([`TaskEvents`]).

use std::time::Duration;

use capwire_envelope::{ErrorBody, ErrorCode, RawValue, ReqId};
use capwire_manifest::{
    RespondArgs, SubscribeArgs, TaskEvent, TaskEventKind, TaskInfo, TaskRef, TaskState,
    TaskSubmitted, TaskVerb, TasksCancel, TasksGet, TasksRespond, TasksSubscribe,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::client::Peer;
use crate::client::stream::ItemStream;
use crate::error::CallError;
use crate::proto::codec;
use crate::time::deadline_after;

/// A task submitted to a peer (or found again by its id): what its
/// submitter, or the peer's control plane, can do with it through
/// `core.tasks`. `T` is the task verb's result type. Cheap to clone.
///
/// Nothing here holds the task open: dropping the handle leaves the task
/// running on the peer, and [`Peer::task`](crate::Peer::task) makes a new
/// handle from the id (after a restart of this node, say).
pub struct TaskHandle<T> {
    peer: crate::Peer,
    id: String,
    _result: std::marker::PhantomData<fn() -> T>,
}

impl<T> Clone for TaskHandle<T> {
    fn clone(&self) -> Self {
        Self {
            peer: self.peer.clone(),
            id: self.id.clone(),
            _result: std::marker::PhantomData,
        }
    }
}

impl<T> std::fmt::Debug for TaskHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskHandle")
            .field("peer", &self.peer.id())
            .field("id", &self.id)
            .finish()
    }
}

/// The value a task's final event or info says it ended with.
fn outcome<T: DeserializeOwned>(
    state: TaskState,
    result: &RawValue,
    error: Option<ErrorBody>,
) -> Result<T, CallError> {
    match state {
        TaskState::Completed => result
            .decode::<T>()
            .map_err(|e| CallError::BadResult(e.to_string())),
        _ => Err(CallError::from_remote(error.unwrap_or_else(|| {
            ErrorBody::new(ErrorCode::Internal, "the task ended without its error")
        }))),
    }
}

impl<T: DeserializeOwned> TaskHandle<T> {
    pub(crate) fn new(peer: crate::Peer, id: String) -> Self {
        Self {
            peer,
            id,
            _result: std::marker::PhantomData,
        }
    }

    /// The task's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The peer the task runs on.
    pub fn peer(&self) -> &crate::Peer {
        &self.peer
    }

    /// What is known about the task now (`core.tasks/get`).
    ///
    /// # Errors
    /// As [`Peer::request`](crate::Peer::request); `not_found` (a
    /// [`CallError::Remote`]) when the task does not exist, its retention
    /// passed, or this node may not see it.
    pub async fn get(&self) -> Result<TaskInfo, CallError> {
        let task = TaskRef {
            task: self.id.clone(),
        };
        self.peer.request(TasksGet, task).await
    }

    /// The task's events from seq `from` on (1: all that are kept), then
    /// each new one as it happens, until its final event
    /// (`core.tasks/subscribe`). The subscription is opened again from
    /// where it was when the peer ends it for time (a task may be quiet
    /// for longer than a stream may idle), so it lasts as long as the
    /// task. Events the peer deleted before they were taken (a log past
    /// its `max_task_events`) are not given: the `seq` then jumps.
    ///
    /// # Errors
    /// As [`Peer::stream`](crate::Peer::stream), when the subscription
    /// cannot be opened; errors after that (`not_found`, a lost session)
    /// come as the stream's last item.
    pub async fn events(&self, from: u64) -> Result<TaskEvents, CallError> {
        let mut events = TaskEvents {
            peer: self.peer.clone(),
            task: self.id.clone(),
            next: from.max(1),
            inner: None,
            done: false,
        };
        events.open().await?;
        Ok(events)
    }

    /// Answers the question the task waits on (`core.tasks/respond`); the
    /// task's info after the answer was written.
    ///
    /// # Errors
    /// As [`Peer::request`](crate::Peer::request); `conflict` when the
    /// task waits on no question; `bad_args` when `answer` is not of the
    /// type the question asked for (the question still waits);
    /// [`CallError::Encode`] when `answer` does not encode.
    pub async fn respond<A: Serialize + ?Sized>(&self, answer: &A) -> Result<TaskInfo, CallError> {
        self.respond_to(None, answer).await
    }

    /// As [`TaskHandle::respond`], but only if the question the task waits
    /// on is the one of event `question_seq` (`conflict` otherwise): for an
    /// answer given to a question seen earlier, which must not answer a
    /// later one.
    ///
    /// # Errors
    /// As [`TaskHandle::respond`].
    pub async fn respond_to<A: Serialize + ?Sized>(
        &self,
        question_seq: Option<u64>,
        answer: &A,
    ) -> Result<TaskInfo, CallError> {
        let answer = RawValue::encode(answer).map_err(|e| CallError::Encode(e.to_string()))?;
        let args = RespondArgs {
            task: self.id.clone(),
            answer,
            question_seq,
        };
        self.peer.request(TasksRespond, args).await
    }

    /// Cancels the task (`core.tasks/cancel`); its info after the cancel.
    /// A task that has already ended is left as it is.
    ///
    /// # Errors
    /// As [`TaskHandle::get`].
    pub async fn cancel(&self) -> Result<TaskInfo, CallError> {
        let task = TaskRef {
            task: self.id.clone(),
        };
        self.peer.request(TasksCancel, task).await
    }

    /// Waits for the task to end: its result, or the error it ended with
    /// (a [`CallError::Remote`] with the handler's error, or
    /// [`CallError::Cancelled`]).
    ///
    /// # Errors
    /// The task's own error as above; otherwise as [`TaskHandle::events`].
    ///
    /// # Cancel safety
    /// Cancel safe: dropping it changes nothing on the peer.
    pub async fn result(&self) -> Result<T, CallError> {
        let info = self.get().await?;
        if info.state.is_final() {
            return outcome(info.state, &info.result, info.error);
        }
        let mut events = self.events(info.seq + 1).await?;
        while let Some(event) = events.next().await {
            let event = event?;
            if event.state.is_final() {
                let error = match event.kind {
                    TaskEventKind::Error => event.body.decode::<ErrorBody>().ok(),
                    _ => None,
                };
                return outcome(event.state, &event.body, error);
            }
        }
        // The subscription ended without the final event (the task's
        // retention passed meanwhile, say): ask once more.
        let info = self.get().await?;
        if info.state.is_final() {
            return outcome(info.state, &info.result, info.error);
        }
        Err(CallError::PeerLost)
    }
}

/// A task's events as they happen (see [`TaskHandle::events`]). Ends
/// (`None`) after the task's final event.
pub struct TaskEvents {
    peer: crate::Peer,
    task: String,
    /// The seq of the next event wanted.
    next: u64,
    inner: Option<ItemStream<TaskEvent>>,
    done: bool,
}

impl std::fmt::Debug for TaskEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskEvents")
            .field("task", &self.task)
            .field("next", &self.next)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl TaskEvents {
    async fn open(&mut self) -> Result<(), CallError> {
        let args = SubscribeArgs {
            task: self.task.clone(),
            from: Some(self.next),
        };
        self.inner = Some(self.peer.stream(TasksSubscribe, args).await?);
        Ok(())
    }

    /// The seq of the next event this stream will give.
    pub fn next_seq(&self) -> u64 {
        self.next
    }

    /// The next event; `None` after the final one.
    ///
    /// # Cancel safety
    /// Cancel safe: an event is taken only when it is returned (a
    /// subscription being opened again when it is dropped is simply
    /// opened again on the next call).
    pub async fn next(&mut self) -> Option<Result<TaskEvent, CallError>> {
        loop {
            if self.done {
                return None;
            }
            let Some(inner) = self.inner.as_mut() else {
                if let Err(e) = self.open().await {
                    self.done = true;
                    return Some(Err(e));
                }
                continue;
            };
            match inner.next().await {
                Some(Ok(event)) => {
                    self.next = event.seq + 1;
                    self.done = event.state.is_final();
                    return Some(Ok(event));
                }
                // The peer ends a subscription well only after the final
                // event, or when the task had ended before `next`.
                None => {
                    self.done = true;
                    return None;
                }
                // A quiet task, or the peer's bound on one handler's
                // time: open it again from where it was.
                Some(Err(CallError::Idle | CallError::Timeout)) => self.inner = None,
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }

    /// The events as a [`Stream`](futures_util::Stream).
    pub fn into_stream(
        self,
    ) -> impl futures_util::Stream<Item = Result<TaskEvent, CallError>> + Send {
        futures_util::stream::unfold(self, |mut events| async move {
            events.next().await.map(|e| (e, events))
        })
    }
}

impl Peer {
    /// Submits task verb `V` (see [`crate::task`]): returns once the peer
    /// has written the task, with its handle; the task then runs on the
    /// peer whatever becomes of this session or this node. Within the
    /// node's default deadline.
    ///
    /// # Errors
    /// [`CallError::Unsupported`] when the peer speaks protocol 1 only
    /// (nothing is sent); `Overloaded` when the peer keeps as many tasks
    /// as it may (in all, or for this node); otherwise as
    /// [`Peer::request`].
    ///
    /// # Cancel safety
    /// As [`Peer::request`]: dropped after the request was sent, the task
    /// may exist without this node knowing its id (it is in
    /// `core.tasks/list`); [`Peer::submit_with_id`] finds it again.
    pub async fn submit<V: TaskVerb>(
        &self,
        _verb: V,
        args: V::Args,
    ) -> Result<TaskHandle<V::Output>, CallError> {
        self.submit_as::<V>(&args, None, self.default_deadline)
            .await
    }

    /// As [`Peer::submit`], with a `req_id` of the caller's choosing and
    /// its own deadline: the peer keys tasks on (this node, `req_id`) for
    /// as long as it keeps them, so a submit sent again (after a timeout,
    /// or this node's restart) gets the same task, not a second one.
    ///
    /// # Errors
    /// As [`Peer::submit`] and [`Peer::request_with_id`].
    ///
    /// # Cancel safety
    /// As [`Peer::submit`].
    pub async fn submit_with_id<V: TaskVerb>(
        &self,
        _verb: V,
        args: V::Args,
        req_id: &ReqId,
        deadline: Duration,
    ) -> Result<TaskHandle<V::Output>, CallError> {
        if req_id.is_fire_and_forget() {
            return Err(CallError::Encode("a task needs a non-empty req_id".into()));
        }
        self.submit_as::<V>(&args, Some(req_id.clone()), deadline)
            .await
    }

    /// Submits a task verb given by name, its args as raw CBOR (see
    /// [`Peer::submit`]); the handle's result is raw CBOR too. With
    /// `req_id`, safe to send again (see [`Peer::submit_with_id`]).
    ///
    /// # Errors
    /// As [`Peer::submit`]; a verb that is not a task verb is refused with
    /// [`CallError::BadResult`] (its answer is not a task's id; a request
    /// verb has then run once).
    ///
    /// # Cancel safety
    /// As [`Peer::submit`].
    pub async fn submit_raw(
        &self,
        cap: &str,
        verb: &str,
        args: &RawValue,
        req_id: Option<&ReqId>,
        deadline: Duration,
    ) -> Result<TaskHandle<RawValue>, CallError> {
        let session = self.session(deadline_after(deadline)).await?;
        if session.lock().version() < capwire_envelope::PROTOCOL_V2 {
            return Err(CallError::Unsupported(
                "the peer speaks protocol 1, which has no tasks".to_owned(),
            ));
        }
        let answer = match req_id {
            Some(id) => self.call_raw_with_id(cap, verb, args, id, deadline).await?,
            None => self.call_raw(cap, verb, args, deadline).await?,
        };
        let submitted = answer
            .decode::<TaskSubmitted>()
            .map_err(|e| CallError::BadResult(e.to_string()))?;
        Ok(TaskHandle::new(self.clone(), submitted.task))
    }

    /// A handle to the task `id` on this peer, known from an earlier
    /// submit, a list or a push: nothing is sent until it is used. `T` is
    /// its verb's result type.
    pub fn task<T: serde::de::DeserializeOwned>(&self, id: impl Into<String>) -> TaskHandle<T> {
        TaskHandle::new(self.clone(), id.into())
    }

    async fn submit_as<V: TaskVerb>(
        &self,
        args: &V::Args,
        req_id: Option<ReqId>,
        deadline: Duration,
    ) -> Result<TaskHandle<V::Output>, CallError> {
        let session = self.session(deadline_after(deadline)).await?;
        if session.lock().version() < capwire_envelope::PROTOCOL_V2 {
            return Err(CallError::Unsupported(
                "the peer speaks protocol 1, which has no tasks".to_owned(),
            ));
        }
        let answer = self
            .call_as(
                (V::CAP, V::VERB),
                req_id,
                deadline,
                |req_id, budget, trace| {
                    codec::control_of(V::CAP, V::VERB, req_id, Some(budget), args, trace)
                },
            )
            .await?;
        let submitted = answer
            .decode::<TaskSubmitted>()
            .map_err(|e| CallError::BadResult(e.to_string()))?;
        Ok(TaskHandle::new(self.clone(), submitted.task))
    }
}
