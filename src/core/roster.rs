//! The roster as plain state: members by cid, a version bumped on every
//! change, and the rules of names and sizes. No I/O: the cluster
//! capability decides with it, writes the change, then applies it.

use std::collections::BTreeMap;

use capwire_envelope::{ErrorBody, ErrorCode, NodeId};
use capwire_manifest::{ChildStatus, Member, MonitoringStatus, Roster as RosterView};

use crate::store::{MemberRecord, RosterMeta};

/// Longest child name, in bytes.
pub(crate) const MAX_CHILD_NAME: usize = 64;
/// Longest bio or persona, in bytes.
pub(crate) const MAX_CHILD_TEXT: usize = 4096;

pub(crate) fn status_str(s: ChildStatus) -> &'static str {
    match s {
        ChildStatus::Pending => "pending",
        ChildStatus::Running => "running",
        ChildStatus::Exited => "exited",
        ChildStatus::Removing => "removing",
    }
}

fn parse_status(s: &str) -> ChildStatus {
    match s {
        "running" => ChildStatus::Running,
        "exited" => ChildStatus::Exited,
        "removing" => ChildStatus::Removing,
        _ => ChildStatus::Pending,
    }
}

pub(crate) fn monitoring_str(m: MonitoringStatus) -> &'static str {
    match m {
        MonitoringStatus::Off => "off",
        MonitoringStatus::Pending => "pending",
        MonitoringStatus::On => "on",
    }
}

fn parse_monitoring(s: &str) -> MonitoringStatus {
    match s {
        "on" => MonitoringStatus::On,
        "pending" => MonitoringStatus::Pending,
        _ => MonitoringStatus::Off,
    }
}

/// A member as the capability works with it.
pub(crate) fn view(m: &MemberRecord) -> Member {
    Member {
        cid: m.cid.clone(),
        name: m.name.clone(),
        bio: m.bio.clone(),
        persona: m.persona.clone(),
        monitoring: parse_monitoring(&m.monitoring),
        caps: m.caps.clone(),
        status: parse_status(&m.status),
        node_id: m.node_id,
        addrs: m.addrs.clone(),
    }
}

pub(crate) fn status_of(m: &MemberRecord) -> ChildStatus {
    parse_status(&m.status)
}

/// `bad_args` unless `name` is 1 to 64 bytes of printable text without
/// leading or trailing spaces.
pub(crate) fn check_name(name: &str) -> Result<(), ErrorBody> {
    let ok = !name.is_empty()
        && name.len() <= MAX_CHILD_NAME
        && !name.chars().any(char::is_control)
        && name.trim() == name;
    if ok {
        Ok(())
    } else {
        Err(ErrorBody::new(
            ErrorCode::BadArgs,
            format!(
                "a child name is 1 to {MAX_CHILD_NAME} bytes of printable text, \
                 without leading or trailing spaces"
            ),
        ))
    }
}

/// `bad_args` when `text` is longer than 4096 bytes.
pub(crate) fn check_text(what: &str, text: &str) -> Result<(), ErrorBody> {
    if text.len() <= MAX_CHILD_TEXT {
        Ok(())
    } else {
        Err(ErrorBody::new(
            ErrorCode::BadArgs,
            format!("{what} is at most {MAX_CHILD_TEXT} bytes"),
        ))
    }
}

/// The roster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Roster {
    pub(crate) meta: RosterMeta,
    pub(crate) members: BTreeMap<String, MemberRecord>,
}

impl Roster {
    pub(crate) fn load(meta: RosterMeta, members: Vec<MemberRecord>) -> Self {
        Self {
            meta,
            members: members.into_iter().map(|m| (m.cid.clone(), m)).collect(),
        }
    }

    pub(crate) fn view(&self) -> RosterView {
        RosterView {
            members: self.members.values().map(view).collect(),
            version: self.meta.version,
        }
    }

    pub(crate) fn get(&self, cid: &str) -> Option<&MemberRecord> {
        self.members.get(cid)
    }

    /// The member a create request made, if it got that far.
    pub(crate) fn by_origin(&self, sender: &NodeId, req_id: &str) -> Option<&MemberRecord> {
        self.members.values().find(|m| {
            m.origin
                .as_ref()
                .is_some_and(|(s, r)| s == sender && r == req_id)
        })
    }

    /// `true` when a member (pending ones included) has this name.
    pub(crate) fn name_taken(&self, name: &str) -> bool {
        self.members.values().any(|m| m.name == name)
    }

    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }

    /// The next cid, and the counters after taking it.
    pub(crate) fn next_cid(&self) -> (String, RosterMeta) {
        let cid = format!("c{}", self.meta.next_cid + 1);
        let meta = RosterMeta {
            version: self.meta.version,
            next_cid: self.meta.next_cid + 1,
        };
        (cid, meta)
    }

    /// The counters after one more change.
    pub(crate) fn bumped(&self, meta: RosterMeta) -> RosterMeta {
        RosterMeta {
            version: meta.version + 1,
            next_cid: meta.next_cid,
        }
    }

    /// What a change of the binding to `controller` does to the roster:
    /// every member watched, or about to be, for another control plane is
    /// `off` from now on (its `watcher` stays until the child's bind is
    /// released: see [`Roster::to_release`]).
    pub(crate) fn handed_over(&self, controller: Option<&NodeId>) -> Vec<MemberRecord> {
        self.members
            .values()
            .filter(|m| {
                m.watcher.as_ref() != controller
                    && m.watcher.is_some()
                    && parse_monitoring(&m.monitoring) != MonitoringStatus::Off
            })
            .map(|m| MemberRecord {
                monitoring: monitoring_str(MonitoringStatus::Off).to_owned(),
                ..m.clone()
            })
            .collect()
    }

    /// The children that may still be bound to a control plane that is
    /// not `controller` (or have a bind open for it): (cid, that control
    /// plane).
    pub(crate) fn to_release(&self, controller: Option<&NodeId>) -> Vec<(String, NodeId)> {
        self.members
            .values()
            .filter_map(|m| {
                let watcher = m.watcher?;
                (Some(&watcher) != controller).then(|| (m.cid.clone(), watcher))
            })
            .collect()
    }

    /// The roster as it will be once `put` is applied under `meta`.
    pub(crate) fn view_with(&self, meta: RosterMeta, put: &[MemberRecord]) -> RosterView {
        let mut next = self.clone();
        next.apply(meta, put, &[]);
        next.view()
    }

    /// Applies a written change.
    pub(crate) fn apply(&mut self, meta: RosterMeta, put: &[MemberRecord], del: &[String]) {
        self.meta = meta;
        for cid in del {
            self.members.remove(cid);
        }
        for m in put {
            self.members.insert(m.cid.clone(), m.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_rules() {
        assert!(check_name("alice").is_ok());
        assert!(check_name("agent 7").is_ok());
        for bad in ["", " a", "a ", "a\nb", &"x".repeat(65)] {
            assert_eq!(
                check_name(bad).unwrap_err().code,
                ErrorCode::BadArgs,
                "{bad:?}"
            );
        }
        assert!(check_text("bio", &"x".repeat(4096)).is_ok());
        assert!(check_text("bio", &"x".repeat(4097)).is_err());
    }

    #[test]
    fn cids_are_never_reused_and_names_include_pending() {
        let mut r = Roster::default();
        let (cid, meta) = r.next_cid();
        assert_eq!(cid, "c1");
        let m = MemberRecord {
            cid: cid.clone(),
            name: "a".into(),
            bio: String::new(),
            persona: String::new(),
            monitoring: "off".into(),
            status: "pending".into(),
            node_id: None,
            addrs: vec![],
            caps: vec![],
            origin: Some((NodeId::from_bytes([1; 32]), "r".into())),
            watcher: None,
            placement: None,
        };
        r.apply(r.bumped(meta), std::slice::from_ref(&m), &[]);
        assert!(r.name_taken("a"));
        assert_eq!(r.view().version, 1);
        assert_eq!(r.view().members[0].status, ChildStatus::Pending);
        assert!(r.by_origin(&NodeId::from_bytes([1; 32]), "r").is_some());
        r.apply(r.bumped(r.meta), &[], &[cid]);
        assert!(!r.name_taken("a"));
        assert_eq!(r.next_cid().0, "c2");
    }
}
