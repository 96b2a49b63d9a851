//! `conclave check`: verifies a recorded history against the reliability properties.

use anyhow::{Context, Result};
use conclave_history::{check, Config};
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct CheckArgs {
    /// Histories to read, JSON lines ("-" for standard input), checked as one: each daemon's
    /// file may be named on its own (a last line a kill cut short is dropped per file, where
    /// `cat` would glue it to the next file's first).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Most views a process may install for one group after the network settles (L3).
    #[arg(long, default_value_t = Config::default().max_views_after_stable)]
    pub max_views_after_stable: usize,
}

/// Prints one JSON line per violation and a summary; fails if anything is violated.
pub fn run(args: CheckArgs) -> Result<()> {
    let mut records = Vec::new();
    for file in &args.files {
        records.extend(
            if file.as_os_str() == "-" {
                conclave_history::record::read(std::io::stdin().lock())
            } else {
                let f = std::fs::File::open(file)
                    .with_context(|| format!("opening {}", file.display()))?;
                conclave_history::record::read(std::io::BufReader::new(f))
            }
            .with_context(|| format!("reading {}", file.display()))?,
        );
    }
    let cfg = Config {
        max_views_after_stable: args.max_views_after_stable,
    };
    let violations = check(&records, &cfg);
    let mut out = std::io::stdout().lock();
    for v in &violations {
        writeln!(
            out,
            "{}",
            serde_json::json!({"property": v.property, "message": v.message, "excerpt": v.excerpt})
        )?;
    }
    writeln!(
        out,
        "{}",
        serde_json::json!({"ok": violations.is_empty(), "records": records.len(), "violations": violations.len()})
    )?;
    if !violations.is_empty() {
        anyhow::bail!("{} violation(s)", violations.len());
    }
    Ok(())
}
