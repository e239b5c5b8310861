//! The binding: which control plane this node answers to.

use capwire_envelope::NodeId;

/// A snapshot of the node's binding: the bound control plane, if any, and
/// the binding epoch, which is bumped on every bind and unbind.
///
/// A [`Permit`](crate::Permit) for a controller verb records the epoch it
/// was granted under; a different epoch at execution time means the binding
/// changed in between and the permit no longer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Binding {
    controller: Option<NodeId>,
    epoch: u64,
}

impl Binding {
    /// Not bound, epoch 0.
    pub const UNBOUND: Binding = Binding {
        controller: None,
        epoch: 0,
    };

    /// A binding from its parts, e.g. restored from storage or in tests.
    /// Live bindings come from [`BindingState::binding`](crate::BindingState::binding).
    pub const fn new(controller: Option<NodeId>, epoch: u64) -> Self {
        Self { controller, epoch }
    }

    /// The bound control plane.
    pub const fn controller(&self) -> Option<&NodeId> {
        self.controller.as_ref()
    }

    /// The binding epoch.
    pub const fn epoch(&self) -> u64 {
        self.epoch
    }

    /// `true` when a control plane is bound.
    pub const fn is_bound(&self) -> bool {
        self.controller.is_some()
    }

    /// `true` when `sender` is the bound control plane.
    pub fn is_controller(&self, sender: &NodeId) -> bool {
        self.controller.as_ref() == Some(sender)
    }

    /// The same controller, next epoch.
    pub(crate) fn bumped(self, controller: Option<NodeId>) -> Self {
        Self {
            controller,
            epoch: self.epoch.wrapping_add(1),
        }
    }
}
