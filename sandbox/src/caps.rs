//! Capabilities: a sandbox started by root keeps none of root's powers
//! (and, unless the policy says `run_as_root`, not its uid either: see
//! [`crate::own_uid`]). The bounding, ambient, inheritable, permitted and effective sets are
//! emptied, so nothing can raise an rlimit, bypass file modes, or regain a
//! capability through exec of a file that carries one.

use caps::CapSet;

use crate::error::{Error, Result};

/// Empty the bounding set, where this thread may (it holds CAP_SETPCAP).
/// Before a change of uid, which takes that right away: a sandbox that runs
/// as a uid of its own ([`crate::own_uid`]) drops it first.
pub fn drop_bounding() -> Result<()> {
    // Dropping from the bounding set needs CAP_SETPCAP; without it there is
    // nothing held worth dropping (an ordinary user's sets are empty).
    let can_drop = caps::has_cap(None, CapSet::Effective, caps::Capability::CAP_SETPCAP)
        .map_err(|e| err("reading capabilities", e))?;
    if can_drop {
        let all = caps::runtime::thread_all_supported();
        for cap in all {
            caps::drop(None, CapSet::Bounding, cap)
                .map_err(|e| err(&format!("dropping {cap} from the bounding set"), e))?;
        }
    }
    Ok(())
}

fn err(what: &str, e: caps::errors::CapsError) -> Error {
    Error::setup(what.to_string(), std::io::Error::other(e.to_string()))
}

/// Empty every capability set of the calling thread.
pub fn drop_all() -> Result<()> {
    drop_bounding()?;
    caps::clear(None, CapSet::Ambient).map_err(|e| err("clearing ambient capabilities", e))?;
    for set in [CapSet::Inheritable, CapSet::Effective, CapSet::Permitted] {
        caps::clear(None, set).map_err(|e| err("clearing capabilities", e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_set_reads_back_empty() {
        crate::readback::in_child("caps::tests::every_set_reads_back_empty", || {
            drop_all().unwrap();
            let sets = [
                CapSet::Bounding,
                CapSet::Ambient,
                CapSet::Inheritable,
                CapSet::Effective,
                CapSet::Permitted,
            ];
            let held: usize = sets
                .into_iter()
                .map(|s| caps::read(None, s).unwrap().len())
                .sum();
            let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
            let eff = status
                .lines()
                .find(|l| l.starts_with("CapEff:"))
                .unwrap()
                .to_string();
            format!("held={held} {eff}")
        })
        .expect_line("held=0 CapEff:\t0000000000000000");
    }
}
