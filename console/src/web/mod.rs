//! The dashboard: a web page of a queue, served by `tasq web` or by a program of its own.
//!
//! Layers, bottom up: [`Source`] (the queue it reads and steers), `history` and `plot` (the
//! figures over time, drawn as SVG), `pages` (HTML, every value escaped), `security` (tokens,
//! hosts, CSRF), `routes` (a request answered), `server` ([`Dashboard`], its threads).

mod history;
mod pages;
mod plot;
mod routes;
mod security;
mod server;
mod source;

pub use security::random_token;
pub use server::{Dashboard, Running, WebError};
pub use source::Source;
