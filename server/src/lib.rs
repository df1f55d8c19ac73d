//! `berth serve`: one long-lived server per user and state dir. The client's
//! side, the protocol and the server's identity live in `berth-client` (the
//! thin `berth` binary links only that); see its crate docs for the flow.

pub mod daemon;
pub mod exec_report;
pub mod live;
pub mod quick;
pub mod tools;
pub mod waits;

pub use berth_client::{
    Mode, PROTOCOL, client, config_key, exe_id, idle_from_env, lock_path, proto, socket_path,
};
