//! Kubernetes mechanisms shared by the controllers: the group's operation
//! lock, the node drain (and its evictions), node helpers and masters'
//! control-plane pods.

pub mod budgets;
pub mod control_plane;
pub mod disruption_slot;
pub mod drain;
pub mod eviction;
pub mod interruption_record;
pub mod lock;
pub mod node;
pub mod own_pod;
pub mod protection;
pub mod workloads;
