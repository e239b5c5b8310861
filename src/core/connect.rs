//! `core.connect`: `introduce` (controller). The control plane hands the
//! node a peer; it becomes a durable contact the node keeps a session with.

use std::sync::Arc;

use capwire_envelope::{ErrorBody, ErrorCode};
use capwire_manifest::{ConnectIntroduce, IntroduceArgs, IntroduceReply};

use crate::addr::Addr;
use crate::contact::Contact;
use crate::core::roster::check_name;
use crate::core::state::{Core, OnceKey, typed};
use crate::dispatch::extract::{Meta, Sender};
use crate::dispatch::handler::{HandlerError, RouteEntry, RouteHandler, Typed};
use crate::store::{Batch, ContactRecord};

fn check(args: &IntroduceArgs, own: &capwire_envelope::NodeId) -> Result<Contact, ErrorBody> {
    check_name(&args.name)?;
    let addr: Addr = args
        .addr
        .parse()
        .map_err(|e| ErrorBody::new(ErrorCode::BadArgs, format!("{e}")))?;
    let id = capwire_transport::canonical_node_id(&args.node_id);
    if id == *own {
        return Err(ErrorBody::new(
            ErrorCode::BadArgs,
            "a node is not its own contact",
        ));
    }
    Ok(Contact {
        name: args.name.clone(),
        id,
        addr,
    })
}

async fn introduce(
    args: IntroduceArgs,
    Sender(from): Sender,
    meta: Meta,
    Core(core): Core,
) -> Result<IntroduceReply, HandlerError> {
    let key = OnceKey::of::<ConnectIntroduce>(from, &meta.req_id);
    let c = core.clone();
    core.detached(async move {
        let mut d = c.durable.lock().await;
        if let Some(answer) = c.remembered(&d, &key) {
            return typed(answer);
        }
        let contact = check(&args, &c.id);
        let record = contact.as_ref().ok().map(|contact| ContactRecord {
            id: contact.id,
            name: contact.name.clone(),
            addr: contact.addr.to_string(),
        });
        let result = match (&contact, &record) {
            (Ok(_), Some(r)) => Ok(IntroduceReply {
                added: d.contacts.get(&r.id) != Some(r),
            }),
            (Err(e), _) => Err(e.clone()),
            (Ok(_), None) => Err(ErrorBody::new(ErrorCode::Internal, "internal")),
        };
        let changed = matches!(result, Ok(IntroduceReply { added: true }));
        let batch = Batch {
            put_contacts: record.iter().filter(|_| changed).cloned().collect(),
            ..Batch::default()
        };
        c.finish(&mut d, &key, batch, &result).await?;
        if let (true, Some(r), Ok(contact)) = (changed, record, contact) {
            d.contacts.insert(r.id, r);
            drop(d);
            c.start_contact(contact);
        }
        result.map_err(HandlerError::from)
    })
    .await
}

pub(crate) fn capability() -> capwire_manifest::Capability<RouteHandler> {
    capwire_manifest::Capability::new(
        capwire_manifest::CORE_CONNECT,
        capwire_manifest::Version::new(1, 0, 0),
    )
    .verb::<ConnectIntroduce>(Arc::new(RouteEntry::durable(Typed::<
        ConnectIntroduce,
        (Sender, Meta, Core),
        _,
    >::new(introduce))))
}
