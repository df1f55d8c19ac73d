//! Resource limits (soft = hard, so the sandbox cannot raise them back).
//! RLIMIT_NPROC counts per user and does not bind root: the pids cgroup
//! ([`crate::cgroup`]) is the bound that holds for root.

use berth_policies::RLimits;
use nix::sys::resource::{Resource, setrlimit};

use crate::error::{Error, Result};

/// The limits as (resource, value, name); a value of 0 means "leave as is".
pub fn table(r: &RLimits) -> [(Resource, u64, &'static str); 4] {
    [
        (Resource::RLIMIT_NPROC, r.nproc, "nproc"),
        (Resource::RLIMIT_NOFILE, r.nofile, "nofile"),
        (Resource::RLIMIT_FSIZE, r.fsize_bytes, "fsize"),
        (Resource::RLIMIT_AS, r.address_space_bytes, "as"),
    ]
}

/// Set every non-zero limit.
pub fn apply(r: &RLimits) -> Result<()> {
    for (res, val, what) in table(r) {
        if val == 0 {
            continue;
        }
        setrlimit(res, val, val).map_err(|e| Error::setup(format!("setrlimit {what}={val}"), e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn limits_read_back() {
        crate::readback::in_child("rlimits::tests::limits_read_back", || {
            let r = RLimits {
                nproc: 77,
                nofile: 99,
                fsize_bytes: 1 << 20,
                address_space_bytes: 8 << 30,
                pids: 0,
            };
            apply(&r).unwrap();
            table(&r)
                .iter()
                .map(|(res, _, what)| {
                    let (soft, hard) = nix::sys::resource::getrlimit(*res).unwrap();
                    format!("{what}={soft}/{hard}")
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .expect_line("nproc=77/77 nofile=99/99 fsize=1048576/1048576 as=8589934592/8589934592");
    }
}
