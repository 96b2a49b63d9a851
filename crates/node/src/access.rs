//! Who may join which groups and send to them: the daemons' access policy (`[[access]]` in the
//! configuration, docs/daemon.md). Rules are tried in order; the first whose `groups` pattern
//! matches a group decides for it, and a group that no rule matches is open to every client.
//! A pattern is a name, a prefix ending in `*`, or `*` alone. Clients are named by the name they
//! connected with (without their daemon's suffix): the policy is as strong as that name, which a
//! client proves only where its connection is authenticated.

use conclave_wire::client::ClientCommand;
use serde::{Deserialize, Serialize};

/// One rule of the policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessRule {
    /// The groups the rule is for.
    pub groups: String,
    /// Who may join them (and ask for their keys); absent: every client.
    #[serde(default)]
    pub join: Option<Vec<String>>,
    /// Who of their members may send to them; absent: every member.
    #[serde(default)]
    pub send: Option<Vec<String>>,
}

/// What a client asked that the policy forbids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denied {
    pub group: String,
    pub what: &'static str,
    /// The rule that decided, counting from 1.
    pub rule: usize,
}

impl std::fmt::Display for Denied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "group {:?}: this client may not {} (access rule {})",
            self.group, self.what, self.rule
        )
    }
}

fn matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

fn check_pattern(p: &str) -> Result<(), String> {
    let body = p.strip_suffix('*').unwrap_or(p);
    if p.is_empty() || body.contains('*') {
        return Err(format!(
            "access pattern {p:?}: a name, a prefix ending in '*', or '*'"
        ));
    }
    Ok(())
}

/// The whole policy: its rules, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Access<'a> {
    rules: &'a [AccessRule],
}

impl<'a> Access<'a> {
    pub fn new(rules: &'a [AccessRule]) -> Access<'a> {
        Access { rules }
    }

    /// Why these rules cannot be used, if they cannot.
    pub fn validate(rules: &[AccessRule]) -> Result<(), String> {
        for r in rules {
            check_pattern(&r.groups)?;
            for p in r.join.iter().chain(&r.send).flatten() {
                check_pattern(p)?;
            }
        }
        Ok(())
    }

    fn rule(&self, group: &str) -> Option<(usize, &'a AccessRule)> {
        self.rules
            .iter()
            .enumerate()
            .find(|(_, r)| matches(&r.groups, group))
            .map(|(i, r)| (i + 1, r))
    }

    fn allowed(list: &Option<Vec<String>>, client: &str) -> bool {
        list.as_ref()
            .is_none_or(|l| l.iter().any(|p| matches(p, client)))
    }

    /// Whether `client` may join `group` (or ask for its keys).
    pub fn join(&self, client: &str, group: &str) -> Result<(), Denied> {
        match self.rule(group) {
            Some((rule, r)) if !Self::allowed(&r.join, client) => Err(Denied {
                group: group.to_owned(),
                what: "join it",
                rule,
            }),
            _ => Ok(()),
        }
    }

    /// Whether `client` may send to `group`.
    pub fn send(&self, client: &str, group: &str) -> Result<(), Denied> {
        match self.rule(group) {
            Some((rule, r)) if !Self::allowed(&r.send, client) => Err(Denied {
                group: group.to_owned(),
                what: "send to it",
                rule,
            }),
            _ => Ok(()),
        }
    }

    /// Whether `client` may give `cmd`: a join needs the right to join, a message the right to
    /// send to each of its groups; a leave and a flush acknowledgement are always allowed.
    pub fn command(&self, client: &str, cmd: &ClientCommand) -> Result<(), Denied> {
        match cmd {
            ClientCommand::Join { group, .. } => self.join(client, group),
            ClientCommand::Multicast { groups, .. } => {
                groups.iter().try_for_each(|g| self.send(client, g))
            }
            ClientCommand::Leave { .. } | ClientCommand::FlushAck { .. } => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use conclave_wire::client::Bytes;
    use conclave_wire::gcs::ServiceType;

    fn rules() -> Vec<AccessRule> {
        vec![
            AccessRule {
                groups: "ops".into(),
                join: Some(vec!["alice".into(), "svc-*".into()]),
                send: Some(vec!["alice".into()]),
            },
            AccessRule {
                groups: "ops*".into(),
                join: Some(vec![]),
                send: None,
            },
            AccessRule {
                groups: "news*".into(),
                join: None,
                send: Some(vec!["editor".into()]),
            },
        ]
    }

    #[test]
    fn the_first_matching_rule_decides_and_other_groups_are_open() {
        let rules = rules();
        let a = Access::new(&rules);
        assert!(a.join("alice", "ops").is_ok());
        assert!(a.join("svc-backup", "ops").is_ok());
        assert_eq!(
            a.join("mallory", "ops"),
            Err(Denied {
                group: "ops".into(),
                what: "join it",
                rule: 1
            })
        );
        assert!(a.send("alice", "ops").is_ok());
        assert!(a.send("svc-backup", "ops").is_err());
        // "ops-db" is not "ops": the second rule, which lets nobody in.
        assert_eq!(a.join("alice", "ops-db").unwrap_err().rule, 2);
        assert!(a.join("anyone", "news-today").is_ok());
        assert!(a.send("anyone", "news-today").is_err());
        assert!(a.send("editor", "news-today").is_ok());
        assert!(a.join("anyone", "chat").is_ok());
        assert!(a.send("anyone", "chat").is_ok());
        let msg = ClientCommand::Multicast {
            service: ServiceType::Agreed,
            groups: vec!["chat".into(), "news".into()],
            payload: Bytes::from_static(b"x"),
        };
        assert_eq!(a.command("anyone", &msg).unwrap_err().group, "news");
        assert!(a
            .command(
                "mallory",
                &ClientCommand::Leave {
                    group: "ops".into()
                }
            )
            .is_ok());
    }

    #[test]
    fn patterns_are_names_prefixes_or_everything() {
        assert!(Access::validate(&rules()).is_ok());
        for bad in ["", "a*b", "**", "*x"] {
            let r = vec![AccessRule {
                groups: bad.into(),
                join: None,
                send: None,
            }];
            assert!(Access::validate(&r).is_err(), "{bad:?}");
        }
        assert!(matches("*", "anything"));
        assert!(!matches("ab", "abc"));
    }
}
