//! `Host` checking, against DNS rebinding: a web page whose name resolves to
//! 127.0.0.1 is same-origin with itself, so CORS cannot stop it, but its
//! requests carry its own name as `Host`. A server bound to a loopback
//! address therefore answers only requests addressed to a loopback name
//! (as Jupyter does), unless `--allowed-hosts` names others.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::server::error::ApiError;

/// Which `Host` values requests may carry.
#[derive(Clone, Debug)]
pub enum AllowedHosts {
    Any,
    /// Lowercase names or addresses, without port.
    Only(Arc<Vec<String>>),
}

impl AllowedHosts {
    /// `--allowed-hosts` as given (`*` allows any); without it, loopback
    /// names only when `bind` is a loopback address, else any.
    pub fn new(listed: &[String], bind: &str) -> Self {
        if listed.iter().any(|h| h == "*") {
            return AllowedHosts::Any;
        }
        let loopback = bind == "localhost"
            || bind
                .trim_matches(['[', ']'])
                .parse::<IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if listed.is_empty() && !loopback {
            return AllowedHosts::Any;
        }
        let mut names: Vec<String> = listed.iter().map(|h| h.to_ascii_lowercase()).collect();
        if listed.is_empty() {
            names.push("localhost".into());
        }
        AllowedHosts::Only(Arc::new(names))
    }

    fn allows(&self, host: &str) -> bool {
        let name = match host.strip_prefix('[') {
            // [v6]:port
            Some(rest) => rest.split(']').next().unwrap_or_default(),
            None => host.rsplit_once(':').map_or(host, |(name, _)| name),
        }
        .to_ascii_lowercase();
        match self {
            AllowedHosts::Any => true,
            AllowedHosts::Only(names) => {
                names.contains(&name)
                    || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
                        && names.iter().any(|n| n == "localhost")
            }
        }
    }
}

/// Refuses a request without exactly one allowed `Host` (403), and one with
/// several `Host` headers (400) whatever they say.
pub async fn check_host(State(hosts): State<AllowedHosts>, req: Request, next: Next) -> Response {
    let mut values = req.headers().get_all(header::HOST).iter();
    let (first, second) = (values.next(), values.next());
    if second.is_some() {
        return ApiError::bad_request("the request has more than one Host header", None)
            .into_response();
    }
    // HTTP/1.1 requires Host; an HTTP/1.0 request may lack it.
    let host = first.map(|v| v.to_str().unwrap_or_default());
    match host {
        Some(h) if !hosts.allows(h) => ApiError::forbidden(format!(
            "Host {h:?} is not one this server answers; start it with --allowed-hosts to add it"
        ))
        .into_response(),
        _ => next.run(req).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_binds_answer_loopback_names_only() {
        let h = AllowedHosts::new(&[], "127.0.0.1");
        for ok in [
            "localhost:8000",
            "127.0.0.1:8000",
            "127.0.0.2",
            "[::1]:80",
            "LOCALHOST",
        ] {
            assert!(h.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8000",
            "localhost.evil.example",
            "",
        ] {
            assert!(!h.allows(bad), "{bad}");
        }
        assert!(AllowedHosts::new(&[], "0.0.0.0").allows("evil.example"));
        assert!(AllowedHosts::new(&["*".into()], "127.0.0.1").allows("x"));
        let listed = AllowedHosts::new(&["wick.lan".into()], "0.0.0.0");
        assert!(listed.allows("wick.lan:8000") && !listed.allows("localhost"));
    }
}
