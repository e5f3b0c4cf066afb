//! Kubernetes mechanisms shared by the controllers: the group's operation
//! lock and the node drain.

pub mod control_plane;
pub mod drain;
pub mod lock;
