//! What stands between a connection and the handlers: accepting
//! connections, `Host` checks, API keys, request bodies, the access log.

pub mod access;
pub mod auth;
pub mod body_guard;
pub mod host_check;
pub mod json_body;
pub mod listener;
