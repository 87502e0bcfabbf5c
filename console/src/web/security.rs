//! Who may use the dashboard, and which requests may change the queue.
//!
//! * Bound to a loopback address, it serves that machine only; bound to any other, it needs an
//!   access token and refuses to start without one. The token comes once in the address
//!   (`/?token=...`), which sets it as a cookie (`HttpOnly`, `SameSite=Strict`), or in an
//!   `Authorization: Bearer` header on every request.
//! * Every request must name this server in its `Host` header (its bound address, or
//!   `localhost` on loopback): a page of another site that rebinds its name to 127.0.0.1 cannot
//!   read the dashboard, and so cannot learn the CSRF token.
//! * Every action is a POST that carries the CSRF token of this server's run, which only a page
//!   it served holds; compared in constant time, as the access token is.

use std::net::SocketAddr;

use subtle::ConstantTimeEq;

/// A fresh random token: 32 bytes as 64 hex digits.
pub fn random_token() -> String {
    use rand::Rng;
    let bytes: [u8; 32] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `given` is `expected`, in time that does not depend on where they differ.
pub fn same(given: &str, expected: &str) -> bool {
    given.as_bytes().ct_eq(expected.as_bytes()).into()
}

/// Whether a request's `Host` header names this server, bound at `bound`.
pub fn host_allowed(host: Option<&str>, bound: SocketAddr) -> bool {
    let Some(host) = host else {
        return false;
    };
    let port = bound.port();
    if host == bound.to_string() {
        return true;
    }
    bound.ip().is_loopback()
        && [
            format!("localhost:{port}"),
            format!("127.0.0.1:{port}"),
            format!("[::1]:{port}"),
        ]
        .iter()
        .any(|name| name == host)
}

/// The access token a request carries: its `Authorization: Bearer` header, its `tasq_token`
/// cookie, or its `token` query parameter.
pub fn presented<'a>(
    authorization: Option<&'a str>,
    cookie: Option<&'a str>,
    query_token: Option<&'a str>,
) -> Option<&'a str> {
    if let Some(bearer) = authorization.and_then(|h| h.strip_prefix("Bearer ")) {
        return Some(bearer.trim());
    }
    if let Some(cookies) = cookie {
        for part in cookies.split(';') {
            if let Some(value) = part.trim().strip_prefix("tasq_token=") {
                return Some(value);
            }
        }
    }
    query_token
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_long_random_and_compared_whole() {
        let a = random_token();
        assert_eq!(a.len(), 64);
        assert_ne!(a, random_token());
        assert!(same(&a, &a.clone()));
        assert!(!same(&a, &a[..63]));
        assert!(!same("", &a));
    }

    #[test]
    fn only_this_server_s_names_are_hosts() {
        let local: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert!(host_allowed(Some("127.0.0.1:8080"), local));
        assert!(host_allowed(Some("localhost:8080"), local));
        assert!(!host_allowed(Some("evil.example:8080"), local));
        assert!(!host_allowed(Some("localhost:9090"), local));
        assert!(!host_allowed(None, local));
        let open: SocketAddr = "10.0.0.5:8080".parse().unwrap();
        assert!(host_allowed(Some("10.0.0.5:8080"), open));
        assert!(!host_allowed(Some("localhost:8080"), open));
    }

    #[test]
    fn a_token_is_read_from_header_cookie_or_query() {
        assert_eq!(presented(Some("Bearer abc"), None, None), Some("abc"));
        assert_eq!(
            presented(None, Some("a=1; tasq_token=xyz"), None),
            Some("xyz")
        );
        assert_eq!(presented(None, None, Some("q")), Some("q"));
        assert_eq!(presented(Some("Basic abc"), None, None), None);
    }
}
