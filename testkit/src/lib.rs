//! Test support for spot-node-manager, kept out of the product: the
//! simulated kubelet ([`sim`], and the `sim-kubelet` binary the demo runs)
//! that turns the emulator's instances into Nodes. The product crate uses it
//! as a dev-dependency only; `cargo install --path .` installs the manager
//! alone.

pub mod sim;
