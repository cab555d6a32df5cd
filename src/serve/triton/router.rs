//! A sticky router in front of several Triton servers serving the same repository: an
//! [haproxy](https://www.haproxy.org/) configuration (haproxy 2.6, Debian 12's) that sends
//! every request of a sequence to one server.
//!
//! Triton keeps a sequence's state in the server that started it and leaves routing to
//! the client (server#1811, #7360). The router routes by a key the client sends with every
//! request, the sequence id in the [`SEQUENCE_HEADER`] header, with consistent hashing
//! (`hash-type consistent`): a server going down moves only its own sequences, onto the
//! servers left, and the others stay where they are. It checks every server by the
//! model's own readiness (`/v2/models/NAME/ready`: a sequence-batcher fault can stop one
//! model while the server stays up, server#8449, #8391), marks a server down after two
//! failed checks half a second apart and then closes the connections it still has to it,
//! so that requests waiting on a hung server fail fast instead of at the request timeout.
//! A request whose connection fails (a server just killed, before the checks say so) is
//! tried once more on another server: it never reached one, so nothing is replayed.
//! Each answer names the server that gave it in [`SERVER_HEADER`]. docs/serving.md
//! ("Several servers") describes the layout and the client's side.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use crate::error::{Error, Result};
use crate::fs::PendingFile;
use crate::message::{Phrase, Setting};

/// The request header carrying a sequence's id: the router's hash key.
pub const SEQUENCE_HEADER: &str = "X-Sequence-Id";
/// The answer header naming the server (its `HOST:PORT`) that answered.
pub const SERVER_HEADER: &str = "X-Triton-Server";
/// The port the router listens on unless told otherwise.
pub const DEFAULT_ROUTER_PORT: u16 = 8080;
/// The address the router listens on unless told otherwise (loopback: Triton has no
/// authentication; `0.0.0.0` shares the router with other hosts).
pub const DEFAULT_ROUTER_ADDRESS: &str = "127.0.0.1";
/// Milliseconds between two health checks of a server.
pub const CHECK_INTERVAL_MS: u64 = 500;
/// Failed checks in a row that mark a server down (and successful ones that bring it back).
pub const CHECKS_TO_CHANGE: u32 = 2;

/// A Triton server's HTTP endpoint, `HOST:PORT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerAddress {
    /// A host name, an IPv4 address, or an IPv6 address in brackets.
    pub host: String,
    /// The HTTP port (1–65535).
    pub port: u16,
}

impl std::fmt::Display for ServerAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

fn bad_server(text: &str, why: &str) -> Error {
    Error::Setting(
        Phrase::text(format!("{text:?} in "))
            .and(Setting::RouterServers)
            .then(format!(" is not HOST:PORT: {why}")),
    )
}

impl ServerAddress {
    /// Parses `HOST:PORT` (`[v6]:PORT` for an IPv6 address).
    pub fn parse(text: &str) -> Result<ServerAddress> {
        let Some((host, port)) = text.rsplit_once(':') else {
            return Err(bad_server(text, "no ':PORT'"));
        };
        let port = match port.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => {
                return Err(bad_server(
                    text,
                    "the port must be a number from 1 to 65535",
                ))
            }
        };
        let name_ok = |h: &str| {
            !h.is_empty()
                && !h.starts_with('-')
                && h.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-'))
        };
        let v6_ok = |h: &str| {
            h.strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok())
        };
        if !(name_ok(host) || v6_ok(host)) {
            return Err(bad_server(
                text,
                "the host must be a name, an IPv4 address or [an IPv6 address]",
            ));
        }
        Ok(ServerAddress {
            host: host.to_string(),
            port,
        })
    }

    /// Parses a comma-separated list of distinct addresses (at least one).
    pub fn parse_list(list: &str) -> Result<Vec<ServerAddress>> {
        let servers = list
            .split(',')
            .map(|s| ServerAddress::parse(s.trim()))
            .collect::<Result<Vec<_>>>()?;
        for (k, s) in servers.iter().enumerate() {
            if servers[..k].contains(s) {
                return Err(Error::Setting(
                    Phrase::setting(Setting::RouterServers)
                        .then(format!(" names {s} twice (each server once)")),
                ));
            }
        }
        Ok(servers)
    }
}

/// What the router configuration says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouterOptions {
    /// The Triton model name every server serves (its readiness is the health check).
    pub model: String,
    /// The servers, each serving the same repository.
    pub servers: Vec<ServerAddress>,
    /// The address the router listens on.
    pub address: String,
    /// The port the router listens on.
    pub port: u16,
}

impl RouterOptions {
    /// Options for `model` on `servers`, listening on the defaults.
    pub fn new(model: &str, servers: Vec<ServerAddress>) -> RouterOptions {
        RouterOptions {
            model: model.to_string(),
            servers,
            address: DEFAULT_ROUTER_ADDRESS.to_string(),
            port: DEFAULT_ROUTER_PORT,
        }
    }

    /// Checks the options on their own: servers given, a valid model name, port and
    /// listening address.
    pub fn check(&self) -> Result<()> {
        super::check_model_name(&self.model)?;
        if self.servers.is_empty() {
            return Err(Error::Setting(
                Phrase::setting(Setting::RouterServers).then(" names no server"),
            ));
        }
        if self.port == 0 {
            return Err(Error::Setting(
                Phrase::setting(Setting::RouterPort).then(" must be from 1 to 65535"),
            ));
        }
        if self.address.parse::<std::net::IpAddr>().is_err() {
            return Err(Error::Setting(
                Phrase::setting(Setting::RouterAddress).then(format!(
                    " {:?} is not an IP address (127.0.0.1, 0.0.0.0, ::)",
                    self.address
                )),
            ));
        }
        Ok(())
    }

    /// The haproxy configuration (`haproxy -f FILE`).
    pub fn haproxy_config(&self) -> String {
        let bind = match self.address.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V6(a)) => format!("[{a}]:{}", self.port),
            _ => format!("{}:{}", self.address, self.port),
        };
        let mut c = String::new();
        let _ = writeln!(
            c,
            "# Written by gmlp-onnx {}: a sticky router for Triton model {:?} on {} servers.\n\
             # Run: haproxy -f THIS_FILE. Every request of a sequence carries its id in the\n\
             # {SEQUENCE_HEADER} header and goes to one server (consistent hashing: a server's\n\
             # loss moves only its own sequences). docs/serving.md, \"Several servers\".",
            env!("CARGO_PKG_VERSION"),
            self.model,
            self.servers.len()
        );
        c.push_str(
            "global\n    maxconn 4096\n\n\
             defaults\n    mode http\n    timeout connect 500ms\n    timeout client 120s\n    \
             timeout server 120s\n    timeout http-keep-alive 120s\n    timeout check 1s\n    \
             # A request whose connection failed never reached a server: tried once more, on\n    \
             # another one. One that reached a server is never sent again.\n    \
             retries 1\n    option redispatch 1\n\n",
        );
        let _ = writeln!(
            c,
            "frontend triton\n    bind {bind}\n    default_backend triton_servers\n"
        );
        let _ = writeln!(
            c,
            "backend triton_servers\n    balance hdr({SEQUENCE_HEADER})\n    \
             hash-type consistent sdbm avalanche\n    option httpchk\n    \
             http-check send meth GET uri /v2/models/{}/ready\n    \
             http-check expect status 200\n    http-response set-header {SERVER_HEADER} %s\n    \
             default-server check inter {CHECK_INTERVAL_MS}ms fastinter {}ms downinter {CHECK_INTERVAL_MS}ms \
             fall {CHECKS_TO_CHANGE} rise {CHECKS_TO_CHANGE} on-marked-down shutdown-sessions",
            self.model,
            CHECK_INTERVAL_MS / 2
        );
        for s in &self.servers {
            let _ = writeln!(c, "    server {s} {s}");
        }
        c
    }

    /// Writes the configuration to `path` as a pending file (a hidden temporary file in
    /// its folder), renamed into place by [`PendingFile::persist`]; dropped, it leaves
    /// nothing. The folder must exist.
    pub fn write_pending(&self, path: &Path) -> Result<PendingFile> {
        self.check()?;
        if path.is_dir() {
            return Err(Error::Setting(
                Phrase::setting(Setting::RouterConfig)
                    .then(format!(" {} is a folder", path.display())),
            ));
        }
        let mut pending = PendingFile::create(path)?;
        pending
            .writer()
            .write_all(self.haproxy_config().as_bytes())
            .map_err(|e| Error::io(path, e))?;
        Ok(pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::triton::testing::names_settings;

    #[test]
    fn server_lists_parse_and_bad_ones_say_why() {
        let s = ServerAddress::parse_list("127.0.0.1:8000, triton-2.local:8001,[::1]:9").unwrap();
        let text: Vec<String> = s.iter().map(ToString::to_string).collect();
        assert_eq!(text, ["127.0.0.1:8000", "triton-2.local:8001", "[::1]:9"]);
        for (bad, why) in [
            ("127.0.0.1", "no ':PORT'"),
            ("127.0.0.1:0", "1 to 65535"),
            ("127.0.0.1:70000", "1 to 65535"),
            ("host:port", "1 to 65535"),
            (":8000", "the host"),
            ("a b:8000", "the host"),
            ("[zz]:8000", "the host"),
            ("-x:8000", "the host"),
        ] {
            let e = ServerAddress::parse(bad).unwrap_err();
            assert!(
                names_settings(&e, &[Setting::RouterServers]),
                "{bad}: {e:?}"
            );
            // The one test of this family's words: which part is not HOST:PORT.
            assert!(e.to_string().contains(why), "{bad}: {e}");
        }
        let e = ServerAddress::parse_list("a:1,b:2,a:1").unwrap_err();
        assert!(names_settings(&e, &[Setting::RouterServers]), "{e:?}");
    }

    #[test]
    fn the_config_hashes_on_the_sequence_and_checks_the_model() {
        let servers = ServerAddress::parse_list("127.0.0.1:8001,127.0.0.1:8002").unwrap();
        let mut o = RouterOptions::new("lm", servers);
        o.port = 9000;
        let c = o.haproxy_config();
        for line in [
            "bind 127.0.0.1:9000",
            "balance hdr(X-Sequence-Id)",
            "hash-type consistent sdbm avalanche",
            "http-check send meth GET uri /v2/models/lm/ready",
            "http-check expect status 200",
            "on-marked-down shutdown-sessions",
            "server 127.0.0.1:8001 127.0.0.1:8001",
            "server 127.0.0.1:8002 127.0.0.1:8002",
        ] {
            assert!(c.contains(line), "{line} missing:\n{c}");
        }
        o.address = "::1".into();
        assert!(o.haproxy_config().contains("bind [::1]:9000"));
        o.address = "localhost".into();
        let e = o.check().unwrap_err();
        assert!(names_settings(&e, &[Setting::RouterAddress]), "{e:?}");
        o.address = "0.0.0.0".into();
        o.servers.clear();
        let e = o.check().unwrap_err();
        assert!(names_settings(&e, &[Setting::RouterServers]), "{e:?}");
    }

    #[test]
    fn a_refused_config_leaves_nothing_and_a_written_one_appears_on_persist() {
        let dir = tempfile::tempdir().unwrap();
        let servers = ServerAddress::parse_list("127.0.0.1:8001").unwrap();
        let o = RouterOptions::new("lm", servers);
        assert!(o.write_pending(dir.path()).is_err());
        let missing = dir.path().join("no/such/folder/router.cfg");
        assert!(o.write_pending(&missing).is_err());
        let path = dir.path().join("router.cfg");
        let pending = o.write_pending(&path).unwrap();
        drop(pending);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        o.write_pending(&path).unwrap().persist().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), o.haproxy_config());
    }
}
