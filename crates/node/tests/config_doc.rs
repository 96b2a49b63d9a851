//! The configuration docs/daemon.md shows with every default written out parses, and its values
//! are the defaults the code has: the defaults are written once, in the config types, and the
//! documentation cannot drift from them.

use conclave_gcs::DaemonConfig;
use conclave_node::config::{LinksConfig, SessionLimits};
use conclave_node::Config;

#[test]
fn the_documented_defaults_are_the_defaults() {
    let doc = include_str!("../../../docs/daemon.md");
    let section = doc
        .split("## Configuration")
        .nth(1)
        .expect("a Configuration section");
    let block = section
        .split("```toml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a toml block");
    let c = Config::parse(block).expect("the documented configuration parses");
    assert_eq!(c.core, DaemonConfig::default());
    assert_eq!(c.sessions, SessionLimits::default());
    assert_eq!(c.links, LinksConfig::default());
    assert_eq!(c.daemon.len(), 2);
    // The simulator's configuration is the deployed one.
    let sim = Config::local(5, 4800);
    assert_eq!(sim.core, c.core);
    assert_eq!(sim.sessions, c.sessions);
    assert_eq!(sim.links, c.links);
}
