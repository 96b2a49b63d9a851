//! The peer column of E1 (`conclave bench gka --peer PATH`): OpenMLS removing a member from a
//! group of the same size, measured by its own program (peers/openmls, outside the workspace so
//! that building Conclave never builds OpenMLS), beside TGDH's join and leave of the same run.

use anyhow::{bail, Context, Result};
use conclave_bench::gka::E1Row;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

/// The peer's rows for group size `n` (one removal), and the row comparing it with TGDH's join
/// and leave at `n` in `rows` (modern suite).
pub(crate) fn compare(peer: &Path, n: usize, rows: &[E1Row]) -> Result<Value> {
    let out = Command::new(peer)
        .args(["--sizes", &n.to_string(), "--repeat", "1"])
        .output()
        .with_context(|| {
            format!(
                "running the peer {} (build it with `cargo build --release --manifest-path \
                 peers/openmls/Cargo.toml`)",
                peer.display()
            )
        })?;
    if !out.status.success() {
        bail!(
            "the peer {} failed: {}",
            peer.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8(out.stdout).context("the peer's output is not UTF-8")?;
    let line = text
        .lines()
        .find(|l| l.starts_with('{'))
        .context("the peer printed no row")?;
    let p: Value = serde_json::from_str(line).context("the peer's row is not JSON")?;
    let field = |k: &str| {
        p[k].as_f64()
            .with_context(|| format!("the peer's row has no {k}"))
    };
    let (commit, process) = (field("commit_ms")?, field("process_ms")?);
    let remove = commit + process;
    let tgdh = |event: &str| {
        rows.iter()
            .find(|r| {
                r.protocol == "tgdh" && r.suite == "modern" && r.event == event && r.n == n as u64
            })
            .map(|r| r.compute_us / 1e3)
    };
    let (join, leave) = (tgdh("join"), tgdh("leave"));
    Ok(json!({
        "experiment": "E1-peer",
        "n": n,
        "peer": p["peer"],
        "peer_suite": p["suite"],
        "peer_event": "remove",
        "peer_commit_ms": commit,
        "peer_process_ms": process,
        "peer_ms": remove,
        "peer_commit_bytes": p["commit_bytes"],
        "tgdh_join_ms": join,
        "tgdh_leave_ms": leave,
        "join_speedup": join.map(|j| remove / j),
        "leave_speedup": leave.map(|l| remove / l),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("conclave-peer-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn script(dir: &Path, file: &str, body: &str) -> std::path::PathBuf {
        let path = dir.join(file);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn a_peer_row_adds_commit_and_processing_and_a_failing_peer_says_so() {
        let dir = scratch("rows");
        let row =
            r#"{"peer":"fake 1","suite":"s","commit_ms":10.5,"process_ms":2,"commit_bytes":7}"#;
        let peer = script(&dir, "peer", &format!("echo 'building'; echo '{row}'"));
        let v = compare(&peer, 64, &[]).unwrap();
        assert_eq!(v["experiment"], "E1-peer");
        assert_eq!(v["n"], 64);
        assert_eq!(v["peer"], "fake 1");
        assert_eq!(v["peer_ms"], 12.5);
        assert_eq!(v["peer_commit_bytes"], 7);
        // No TGDH rows of that size in this run: nothing to compare with.
        assert!(v["join_speedup"].is_null() && v["tgdh_leave_ms"].is_null());

        // A failing or silent peer is an error that says so. (One test: scripts are written and
        // run one after the other, never while another test's child holds one open.)
        let failing = script(&dir, "failing", "echo 'no such size' >&2; exit 3");
        let e = compare(&failing, 64, &[]).unwrap_err().to_string();
        assert!(e.contains("failed") && e.contains("no such size"), "{e}");
        let silent = script(&dir, "silent", "echo 'nothing'");
        let e = compare(&silent, 64, &[]).unwrap_err().to_string();
        assert!(e.contains("no row"), "{e}");
        let missing = dir.join("absent");
        let e = format!("{:#}", compare(&missing, 64, &[]).unwrap_err());
        assert!(e.contains("cargo build --release --manifest-path"), "{e}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
