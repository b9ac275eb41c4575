//! OpenStack Placement: warm capacity per page size as a custom resource class on a child
//! provider of the compute node's provider, so the scheduler can prefer warm hosts.
//! See `docs/openstack.md`.

pub mod client;
pub mod config;
pub mod consumers;
pub mod error;
pub mod http;
pub mod inventory;
pub mod keystone;
pub mod microversion;
pub mod publisher;
pub mod status;

pub use config::{PlacementConfig, PlacementSpec};
pub use error::PlacementError;
pub use publisher::{spawn, Publisher};
pub use status::{Published, Snapshot, State, Status};
