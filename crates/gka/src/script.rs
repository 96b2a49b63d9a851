//! The event script format of `conclave gka run` (see `docs/gka-script.md`).
//!
//! One event a line, `#` starts a comment: `init a b c`, `join e`, `leave b`, `merge f g`,
//! `partition c d`. A prefix `+K ` injects the event after K protocol messages of the run still
//! in progress have been delivered (a cascade).

use crate::api::MemberId;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Init(Vec<MemberId>),
    Join(MemberId),
    Leave(MemberId),
    Merge(Vec<MemberId>),
    Partition(Vec<MemberId>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// Inject after this many messages of the current run (None: after the run is over).
    pub after: Option<usize>,
    pub action: Action,
    pub line: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {msg}")]
pub struct ScriptError {
    pub line: usize,
    pub msg: String,
}

pub const MAX_SCRIPT_STEPS: usize = 100_000;

pub fn parse(text: &str) -> Result<Vec<Step>, ScriptError> {
    let mut steps = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let err = |msg: String| ScriptError { line, msg };
        let content = raw.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let mut words = content.split_whitespace().peekable();
        let mut after = None;
        if let Some(w) = words.peek() {
            if let Some(k) = w.strip_prefix('+') {
                after = Some(
                    k.parse::<usize>()
                        .map_err(|_| err(format!("bad cascade prefix {w:?}")))?,
                );
                words.next();
            }
        }
        let verb = words.next().ok_or_else(|| err("missing event".into()))?;
        let names: Vec<MemberId> = words.map(str::to_owned).collect();
        for n in &names {
            if n.len() > conclave_wire::gka::MAX_NAME_BYTES {
                return Err(err(format!(
                    "member name {n:?} is longer than {} bytes",
                    conclave_wire::gka::MAX_NAME_BYTES
                )));
            }
        }
        let one = |names: &[MemberId]| -> Result<MemberId, ScriptError> {
            match names {
                [n] => Ok(n.clone()),
                _ => Err(err(format!("{verb} takes exactly one member"))),
            }
        };
        let some = |names: Vec<MemberId>| -> Result<Vec<MemberId>, ScriptError> {
            if names.is_empty() {
                Err(err(format!("{verb} needs at least one member")))
            } else {
                Ok(names)
            }
        };
        let action = match verb {
            "init" => Action::Init(some(names)?),
            "join" => Action::Join(one(&names)?),
            "leave" => Action::Leave(one(&names)?),
            "merge" => Action::Merge(some(names)?),
            "partition" => Action::Partition(some(names)?),
            other => {
                return Err(err(format!(
                    "unknown event {other:?} (expected init, join, leave, merge or partition)"
                )))
            }
        };
        if steps.len() >= MAX_SCRIPT_STEPS {
            return Err(err(format!("more than {MAX_SCRIPT_STEPS} events")));
        }
        steps.push(Step {
            after,
            action,
            line,
        });
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn parses_all_forms() {
        let s = parse("# a comment\ninit a b c d\njoin e # trailing\n+3 leave b\n\nmerge f g\npartition c d\n").unwrap();
        assert_eq!(s.len(), 5);
        assert_eq!(
            s[0].action,
            Action::Init(vec!["a".into(), "b".into(), "c".into(), "d".into()])
        );
        assert_eq!(s[2].after, Some(3));
        assert_eq!(s[2].action, Action::Leave("b".into()));
        assert_eq!(s[4].line, 7);
    }
    #[test]
    fn rejects_bad_lines() {
        assert_eq!(parse("jump a").unwrap_err().line, 1);
        assert!(parse("join a b").is_err());
        assert!(parse("+x join a").is_err());
        assert!(parse("init").is_err());
        assert!(parse("+2").is_err());
    }
}
