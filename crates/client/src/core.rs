//! The pure part of a client session: splitting the daemon's byte stream into replies, checking
//! requests before they are sent, and the state the library keeps (its name, the groups it has
//! asked to be in). No I/O here; [`crate::Client`] drives it.

use conclave_wire::client::{frame, next_frame, ClientCommand, Reply, Request};
use conclave_wire::gcs::{MAX_GROUPS_PER_MESSAGE, MAX_NAME_BYTES, MAX_PAYLOAD_BYTES};
use conclave_wire::DecodeError;
use std::collections::BTreeSet;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the daemon refused: {0}")]
    Refused(String),
    #[error("the connection to the daemon is lost")]
    Disconnected,
    #[error("the daemon closed the session: {0}")]
    Closed(String),
    #[error("the daemon sent something undecodable: {0}")]
    Protocol(#[from] DecodeError),
    #[error("{0}")]
    Invalid(String),
    #[error("connecting: {0}")]
    Io(#[from] std::io::Error),
}

/// Splits replies off the daemon's byte stream.
#[derive(Default)]
pub struct ReplyDecoder {
    buf: Vec<u8>,
    start: usize,
}

impl ReplyDecoder {
    /// Room to read into.
    pub fn buffer(&mut self) -> &mut Vec<u8> {
        if self.start > 0 && self.start * 2 >= self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        if self.buf.capacity() - self.buf.len() < 16 * 1024 {
            self.buf.reserve(64 * 1024);
        }
        &mut self.buf
    }

    /// The next complete reply, if one has arrived.
    pub fn next_reply(&mut self) -> Result<Option<Reply>, DecodeError> {
        match next_frame(&self.buf[self.start..])? {
            None => Ok(None),
            Some((body, used)) => {
                let r = Reply::decode(body)?;
                self.start += used;
                Ok(Some(r))
            }
        }
    }
}

/// What the library knows of its session, to refuse bad requests before they travel.
#[derive(Default, Debug)]
pub struct SessionState {
    /// Groups joined (or asked to be), as the daemon will see them.
    pub groups: BTreeSet<String>,
}

fn check_name(what: &str, s: &str) -> Result<(), ClientError> {
    if s.is_empty() || s.len() > MAX_NAME_BYTES {
        return Err(ClientError::Invalid(format!(
            "a {what} name is 1 to {MAX_NAME_BYTES} bytes"
        )));
    }
    Ok(())
}

impl SessionState {
    /// Checks a command against what the daemon would refuse, updates the state, and gives the
    /// framed request.
    pub fn command(&mut self, cmd: ClientCommand) -> Result<Vec<u8>, ClientError> {
        match &cmd {
            ClientCommand::Join { group, .. } => {
                check_name("group", group)?;
                if self.groups.contains(group) {
                    return Err(ClientError::Invalid(format!("already in group {group:?}")));
                }
                self.groups.insert(group.clone());
            }
            ClientCommand::Leave { group } => {
                if !self.groups.remove(group) {
                    return Err(ClientError::Invalid(format!("not in group {group:?}")));
                }
            }
            ClientCommand::Multicast {
                groups, payload, ..
            } => {
                if groups.is_empty() || groups.len() > MAX_GROUPS_PER_MESSAGE {
                    return Err(ClientError::Invalid(format!(
                        "a message goes to 1 to {MAX_GROUPS_PER_MESSAGE} groups"
                    )));
                }
                let distinct: BTreeSet<_> = groups.iter().collect();
                if distinct.len() != groups.len() {
                    return Err(ClientError::Invalid("a group is named twice".into()));
                }
                if let Some(g) = groups.iter().find(|g| !self.groups.contains(*g)) {
                    return Err(ClientError::Invalid(format!("not in group {g:?}")));
                }
                if payload.len() > MAX_PAYLOAD_BYTES {
                    return Err(ClientError::Invalid(format!(
                        "a payload is at most {MAX_PAYLOAD_BYTES} bytes"
                    )));
                }
            }
            ClientCommand::FlushAck { .. } => {}
        }
        Ok(frame(&Request::Command(cmd).encode()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use conclave_wire::client::ClientEvent;
    use conclave_wire::gcs::ServiceType;

    #[test]
    fn replies_split_off_a_stream_in_any_chunking() {
        let replies = vec![
            Reply::Connected {
                name: "a#d1".into(),
            },
            Reply::Event(ClientEvent::Left { group: "g".into() }),
            Reply::Refused {
                reason: "no".into(),
            },
        ];
        let bytes: Vec<u8> = replies.iter().flat_map(|r| frame(&r.encode())).collect();
        for chunk in [1, 3, 7, bytes.len()] {
            let mut d = ReplyDecoder::default();
            let mut got = Vec::new();
            for c in bytes.chunks(chunk) {
                d.buffer().extend_from_slice(c);
                while let Some(r) = d.next_reply().unwrap() {
                    got.push(r);
                }
            }
            assert_eq!(got, replies);
        }
        let mut d = ReplyDecoder::default();
        d.buffer().extend_from_slice(&[0, 0, 0, 2, 9, 9]);
        assert!(d.next_reply().is_err());
    }

    #[test]
    fn bad_requests_are_refused_before_they_travel() {
        let mut s = SessionState::default();
        let msg = |groups: &[&str], n: usize| ClientCommand::Multicast {
            service: ServiceType::Agreed,
            groups: groups.iter().map(|g| g.to_string()).collect(),
            payload: vec![0; n].into(),
        };
        assert!(s.command(msg(&["g"], 1)).is_err());
        s.command(ClientCommand::Join {
            group: "g".into(),
            vs: false,
        })
        .unwrap();
        assert!(s
            .command(ClientCommand::Join {
                group: "g".into(),
                vs: false
            })
            .is_err());
        s.command(msg(&["g"], 1)).unwrap();
        assert!(s.command(msg(&["g", "g"], 1)).is_err());
        assert!(s.command(msg(&[], 1)).is_err());
        assert!(s.command(msg(&["g"], MAX_PAYLOAD_BYTES + 1)).is_err());
        assert!(s
            .command(ClientCommand::Join {
                group: String::new(),
                vs: false
            })
            .is_err());
        s.command(ClientCommand::Leave { group: "g".into() })
            .unwrap();
        assert!(s
            .command(ClientCommand::Leave { group: "g".into() })
            .is_err());
    }
}
