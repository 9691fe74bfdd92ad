//! Names of the network namespaces tests make, and the clean-up of those that dead test
//! processes left behind.
//!
//! Every namespace a test makes is named `rbtlf<pid>t<tag>`: apart from those the tools
//! make with `tools/netns.sh` (`rbtlompi` for `tools/ompi-netns.sh`, `rbtl` for a manual
//! `tools/netns.sh up`, `rbtlab<pid>`, `rbtlmc<pid>` and `rbtlp<pid>` for the comparison
//! scripts), so that [`remove_stale`] never touches them.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// The prefix of every test namespace.
pub const NS_PREFIX: &str = "rbtlf";

/// `rbtlf<pid>t<tag>`: a name of this process's.
pub fn name(tag: impl std::fmt::Display) -> String {
    format!("{NS_PREFIX}{}t{tag}", std::process::id())
}

/// A name no other call of this process returns (`rbtlf<pid>t<n>`).
pub fn fresh_name() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    name(N.fetch_add(1, Ordering::Relaxed))
}

/// Removes the namespaces of test processes that ended without cleaning up (killed by a
/// time limit, say): every `rbtlf<pid>t...` whose process is gone.
pub fn remove_stale() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for name in dir
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
    {
        let pid = name
            .strip_prefix(NS_PREFIX)
            .and_then(|r| r.split_once('t'))
            .and_then(|(p, _)| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
                eprintln!("removing {name}, left by process {pid}");
                let _ = Command::new("ip")
                    .args(["netns", "delete", &name])
                    .stdin(Stdio::null())
                    .output();
            }
        }
    }
}
