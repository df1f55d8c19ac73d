//! berth's service layer and its typed API, `berth.v1`
//! (`proto/berth/v1.proto`).
//!
//! [`Service`] answers what a front end asks of the runtime, with typed
//! values: sandboxes, files, jobs, checkpoints and approvals. It prints
//! nothing and parses no command line; a front end does both. [`api`] serves
//! it as gRPC beside the CLI's own service on `berth serve`'s socket, so a
//! program in any language (the Python SDK in `sdk/python`) uses berth
//! through typed calls, not CLI text.
//!
//! Flow of a call: the server accepts a connection and reads its peer's uid
//! (`SO_PEERCRED`); [`api::routes`] binds that uid's standing ([`Caller`])
//! into every service of the connection; a call from another uid is refused
//! before it reaches [`Service`]. Commands (`Commands.Exec`) run through the
//! server's own exec path ([`Host`]), so they are counted, interrupted and
//! drained like the CLI's.

pub mod answers;
pub mod api;
pub mod convert;
pub mod detached;
pub mod proto;
mod service;

pub use api::{Caller, Host};
pub use service::{Made, READ_MAX, Service};
