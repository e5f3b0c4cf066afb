//! Kubernetes mechanisms shared by the controllers: the group's operation
//! lock, the node drain, node helpers and masters' control-plane pods.

pub mod control_plane;
pub mod drain;
pub mod interruption_record;
pub mod lock;
pub mod node;
