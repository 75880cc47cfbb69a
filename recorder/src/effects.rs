//! Effects outside the file system: connects, datagrams to explicit destinations, and signals.
//! None of them can be undone; each is journaled so that undo can name it, and the strict
//! policy can refuse it.
//!
//! What this module cannot do: see connects and sends that glibc makes internally (DNS, nscd,
//! syslog) when only the shim watches, or traffic over a socket the process inherited already
//! connected. Netlink and packet sockets are not journaled.

use aether_journal::BPath;
use aether_journal::config::Policy;
use aether_journal::record::{ConnectResult, Endpoint, Op};

use crate::ops::{Caller, Journal, Pending, refuse};

/// Parses a `sockaddr` (as raw bytes of the length the caller passed) into an endpoint, for
/// the families journaled: `AF_INET`, `AF_INET6` and `AF_UNIX`.
pub fn parse_endpoint(sa: &[u8]) -> Option<Endpoint> {
    if sa.len() < 2 {
        return None;
    }
    let family = u16::from_ne_bytes([sa[0], sa[1]]) as i32;
    match family {
        libc::AF_INET if sa.len() >= 8 => {
            let port = u16::from_be_bytes([sa[2], sa[3]]);
            let ip = std::net::Ipv4Addr::new(sa[4], sa[5], sa[6], sa[7]);
            Some(Endpoint { family: "inet".into(), address: BPath::from(ip.to_string().as_str()), port: Some(port) })
        }
        libc::AF_INET6 if sa.len() >= 24 => {
            let port = u16::from_be_bytes([sa[2], sa[3]]);
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&sa[8..24]);
            let ip = std::net::Ipv6Addr::from(octets);
            Some(Endpoint { family: "inet6".into(), address: BPath::from(ip.to_string().as_str()), port: Some(port) })
        }
        libc::AF_UNIX => {
            let path = &sa[2..];
            let address = match path.first() {
                // An abstract socket: a NUL then the name (its length is the address length).
                Some(0) => [&b"@"[..], &path[1..]].concat(),
                _ => path.split(|&b| b == 0).next().unwrap_or_default().to_vec(),
            };
            if address.is_empty() {
                return None; // an unnamed socket
            }
            Some(Endpoint { family: "unix".into(), address: BPath::new(address), port: None })
        }
        _ => None,
    }
}

/// Whether an endpoint is on this machine's loopback.
pub fn is_loopback(ep: &Endpoint) -> bool {
    let text = ep.address.display_lossy();
    match ep.family.as_str() {
        "inet" => text.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback()),
        "inet6" => text
            .parse::<std::net::Ipv6Addr>()
            .is_ok_and(|ip| ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())),
        _ => false,
    }
}

/// Whether the strict policy refuses a connection to (or datagram for) `ep`.
fn strict_refuses<J: Journal>(journal: &J, ep: &Endpoint) -> bool {
    let settings = journal.settings();
    settings.policy == Policy::Strict && (settings.network_deny || (ep.family != "unix" && !is_loopback(ep)))
}

/// Before connect: refuse under the strict policy, or remember the endpoint so that the
/// outcome can be journaled with it (or, where the result is never seen, journal it now).
pub fn before_connect<J: Journal, C: Caller>(journal: &J, caller: &C, call: &str, ep: Endpoint) -> Pending {
    if strict_refuses(journal, &ep) {
        return refuse(journal, call, format!("network connection to {ep}"), libc::EACCES);
    }
    if !caller.sees_results() {
        journal.record(call, Op::Connect { peer: Box::new(ep), result: ConnectResult::Unknown });
        return Pending::Nothing;
    }
    Pending::Connect(ep)
}

/// After connect: journal the endpoint and whether the connection was made.
pub fn after_connect<J: Journal>(journal: &J, call: &str, peer: Endpoint, succeeded: bool, errno: i32) {
    let result = if succeeded {
        ConnectResult::Ok
    } else if errno == libc::EINPROGRESS || errno == libc::EINTR || errno == libc::EALREADY {
        ConnectResult::InProgress
    } else {
        ConnectResult::Failed { errno }
    };
    journal.record(call, Op::Connect { peer: Box::new(peer), result });
}

/// Before sendto/sendmsg/sendmmsg with an explicit destination.
pub fn before_send<J: Journal, C: Caller>(journal: &J, caller: &C, call: &str, peer: Endpoint) -> Pending {
    if strict_refuses(journal, &peer) {
        return refuse(journal, call, format!("datagram to {peer}"), libc::EACCES);
    }
    if caller.first_send_to(&peer) {
        journal.record(call, Op::Send { peer: Box::new(peer) });
    }
    Pending::Nothing
}

/// Reads `root_pid` from a header without a full parse.
pub fn serde_json_root_pid(text: &[u8]) -> Option<u32> {
    let key = b"\"root_pid\":";
    let at = text.windows(key.len()).position(|w| w == key)? + key.len();
    let digits: String = text[at..]
        .iter()
        .skip_while(|b| b.is_ascii_whitespace())
        .take_while(|b| b.is_ascii_digit())
        .map(|&b| b as char)
        .collect();
    digits.parse().ok()
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid ...: comm may contain spaces and parentheses.
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Whether `pid` belongs to this session: it descends from the session's root process (or the
/// caller, `me`), or its environment names this session's directory.
fn is_member<J: Journal>(journal: &J, me: u32, pid: u32) -> bool {
    if pid == me {
        return true;
    }
    if let Some(root) = journal.root_pid() {
        let mut p = pid;
        for _ in 0..128 {
            if p == root || p == me {
                return true;
            }
            match parent_of(p) {
                Some(pp) if pp > 1 => p = pp,
                _ => break,
            }
        }
    }
    let mut needle = b"AETHER_JOURNAL_DIR=".to_vec();
    needle.extend_from_slice(journal.session_dir());
    needle.push(0);
    std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| env.windows(needle.len()).any(|w| w == needle))
}

fn program_of(pid: u32) -> Option<BPath> {
    if let Ok(p) = rustix::fs::readlink(format!("/proc/{pid}/exe").as_str(), Vec::new()) {
        return Some(BPath::new(p.into_bytes()));
    }
    let comm = std::fs::read(format!("/proc/{pid}/comm")).ok()?;
    Some(BPath::new(comm.strip_suffix(b"\n").unwrap_or(&comm).to_vec()))
}

/// Before kill/killpg/tgkill/sigqueue with a real signal. `target` is a pid, 0 (own process
/// group), -1 (every process) or -pgid.
pub fn before_signal<J: Journal, C: Caller>(journal: &J, caller: &C, call: &str, target: i64, signal: i32) -> Pending {
    let (me, own_group) = caller.pid_and_group();
    let (outside, who) = match target {
        0 => (false, None),
        -1 => (true, None),
        t if t < -1 && -t == own_group => (false, None),
        t if t < -1 => (!is_member(journal, me, (-t) as u32), Some((-t) as u32)),
        t => (!is_member(journal, me, t as u32), Some(t as u32)),
    };
    let target_prog = who.and_then(program_of);
    if outside && journal.settings().policy == Policy::Strict {
        let prog = target_prog.as_ref().map(|p| format!(" ({})", p.display_lossy())).unwrap_or_default();
        return refuse(
            journal,
            call,
            format!("signal {signal} to process {target}{prog} outside the session"),
            libc::EPERM,
        );
    }
    journal.record(call, Op::Signal { target, target_prog: target_prog.map(Box::new), signal, outside });
    Pending::Nothing
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sockaddr_in(ip: [u8; 4], port: u16) -> Vec<u8> {
        let mut v = vec![0u8; 16];
        v[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        v[2..4].copy_from_slice(&port.to_be_bytes());
        v[4..8].copy_from_slice(&ip);
        v
    }

    #[test]
    fn inet_endpoints_carry_address_and_port() {
        let ep = parse_endpoint(&sockaddr_in([127, 0, 0, 1], 8080)).unwrap();
        assert_eq!(ep.to_string(), "127.0.0.1:8080");
        assert!(is_loopback(&ep));
        assert!(!is_loopback(&parse_endpoint(&sockaddr_in([10, 1, 2, 3], 80)).unwrap()));
    }

    #[test]
    fn unix_endpoints_name_the_path_or_the_abstract_name() {
        let mut v = (libc::AF_UNIX as u16).to_ne_bytes().to_vec();
        v.extend_from_slice(b"/run/docker.sock\0\0\0");
        assert_eq!(parse_endpoint(&v).unwrap().address, BPath::from("/run/docker.sock"));
        let mut a = (libc::AF_UNIX as u16).to_ne_bytes().to_vec();
        a.extend_from_slice(b"\0my-abstract");
        assert_eq!(parse_endpoint(&a).unwrap().address, BPath::from("@my-abstract"));
        assert_eq!(parse_endpoint(&(libc::AF_UNIX as u16).to_ne_bytes()), None, "unnamed");
        assert_eq!(parse_endpoint(&(libc::AF_NETLINK as u16).to_ne_bytes()), None);
    }

    #[test]
    fn the_root_pid_is_read_from_a_header() {
        assert_eq!(serde_json_root_pid(b"{\"id\":\"x\",\"root_pid\": 4242,\"a\":1}"), Some(4242));
        assert_eq!(serde_json_root_pid(b"{\"root_pid\":null}"), None);
    }
}
