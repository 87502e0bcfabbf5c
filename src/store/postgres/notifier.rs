//! The notifier: the maintenance thread's connection that listens on the queue's channel, kept
//! alive and replaced when it dies.
//!
//! # Liveness
//!
//! A notification is only a hint (every duty it triggers also runs on a timer), so a dead
//! listener costs latency, never correctness; but it must not cost it for long, nor burn CPU.
//!
//! * A connection that reports closed (its server process was terminated, the server
//!   restarted) is dropped at once, and a new one is made after a backoff that doubles from
//!   100 ms to 5 s and starts over once a connection proves alive: a listener killed every
//!   100 ms retries at that pace, without spinning.
//! * A connection can also die silently: a half-open TCP connection (the peer vanished, bytes
//!   swallowed, no FIN or RST), or a server process that stopped. Nothing then arrives, and
//!   nothing reports an error. So a listener that has heard nothing for [`PING_EVERY`] pings
//!   itself: it listens on a channel of its own too, and sends a notification to it through
//!   the store's connection pool. If that does not arrive within [`PING_TIMEOUT`], the listener
//!   is dropped and replaced. A silent listener is thus replaced within about
//!   `PING_EVERY + PING_TIMEOUT` (and the wait for its answer never blocks: notifications are
//!   read with a timeout).
//! * Every connection of the store also has TCP keepalives and a user timeout (see
//!   `conn::tcp_settings`), so the kernel ends a connection whose peer stopped acknowledging.

use std::time::{Duration, Instant};

use postgres::Client;
use postgres::fallible_iterator::FallibleIterator;

use super::conn::{self, Sql};
use super::store::PgStore;

/// A listener that heard nothing for this long pings itself.
const PING_EVERY: Duration = Duration::from_secs(5);

/// A ping that has not come back within this is a dead listener.
const PING_TIMEOUT: Duration = Duration::from_secs(2);

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// The listening connection and what keeps it alive.
pub(super) struct Notifier {
    client: Option<Client>,
    /// This listener's own channel, for its pings.
    own: String,
    reconnect_at: Instant,
    backoff: Duration,
    /// When anything last arrived (or the connection was made).
    heard_at: Instant,
    /// A ping sent and not yet back: when it was sent.
    ping_sent: Option<Instant>,
    /// Listeners made so far (the first included).
    connections: u64,
}

impl Notifier {
    pub(super) fn new() -> Notifier {
        let now = Instant::now();
        let own = {
            use rand::{RngCore, SeedableRng};
            format!(
                "tasq_ping_{:016x}",
                rand::rngs::SmallRng::from_os_rng().next_u64()
            )
        };
        Notifier {
            client: None,
            own,
            reconnect_at: now,
            backoff: BACKOFF_MIN,
            heard_at: now,
            ping_sent: None,
            connections: 0,
        }
    }

    /// Waits up to `step` for notifications and returns their words (a ping's answer is not
    /// among them); makes or replaces the connection as needed. `Err(())`-free: with no
    /// connection it sleeps `step` (or until the next attempt to connect, if sooner).
    /// `connected` is called after each new connection (whatever was announced while nobody
    /// listened must be looked for).
    pub(super) fn receive(
        &mut self,
        store: &PgStore,
        step: Duration,
        connected: impl FnOnce(),
    ) -> Vec<String> {
        let now = Instant::now();
        if self.client.is_none() {
            if now < self.reconnect_at {
                std::thread::sleep(step.min(self.reconnect_at - now));
                return Vec::new();
            }
            match listen(&store.target, &self.own) {
                Ok(client) => {
                    self.client = Some(client);
                    self.connections += 1;
                    self.heard_at = Instant::now();
                    self.ping_sent = None;
                    connected();
                }
                Err(_) => {
                    self.lost();
                    return Vec::new();
                }
            }
        }
        let Some(client) = self.client.as_mut() else {
            return Vec::new();
        };
        let (words, alive) = read(client, step);
        if !alive || client.is_closed() {
            self.lost();
            return words;
        }
        let now = Instant::now();
        let ping = format!("ping:{}", self.own);
        let answered = words.contains(&ping);
        if !words.is_empty() {
            self.heard_at = now;
        }
        if answered {
            // Alive: the next death backs off from the start again.
            self.ping_sent = None;
            self.backoff = BACKOFF_MIN;
        }
        match self.ping_sent {
            Some(sent) if now.duration_since(sent) >= PING_TIMEOUT => {
                // Silent: half-open, or its server process stopped.
                self.lost();
            }
            None if now.duration_since(self.heard_at) >= PING_EVERY => {
                self.ping_sent = Some(now);
                // Through the pool; if the database is away, the ping is lost, and so is the
                // listener after the timeout: it reconnects with the others.
                let _ =
                    store.with_conn(|c| c.execute("SELECT pg_notify($1, $2)", &[&self.own, &ping]));
            }
            _ => {}
        }
        words.into_iter().filter(|w| *w != ping).collect()
    }

    /// Drops the connection; the next is made after the backoff, which doubles.
    fn lost(&mut self) {
        self.client = None;
        self.ping_sent = None;
        self.reconnect_at = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
    }
}

/// A connection that listens on the queue's channel (see `notify`) and on `own`.
fn listen(target: &conn::Target, own: &str) -> Result<Client, postgres::Error> {
    let mut client = target.connect()?;
    let channel: String = client.query_one("SELECT tasq_channel()", &[])?.get(0);
    let quote = |name: &str| format!("\"{}\"", name.replace('"', "\"\""));
    client.batch_execute(&format!(
        "LISTEN {}; LISTEN {}",
        quote(&channel),
        quote(own)
    ))?;
    Ok(client)
}

/// The words of the notifications that arrive within `wait`, and whether the connection is
/// still fine: it waits for the first only, then takes what is already buffered, so a steady
/// stream of notifications can neither hold the loop's other duties up nor delay the one that
/// wakes the fetcher.
fn read(client: &mut Client, wait: Duration) -> (Vec<String>, bool) {
    let mut words = Vec::new();
    let mut notifications = client.notifications();
    let first = match notifications.timeout_iter(wait).next() {
        Ok(first) => first,
        Err(_) => return (words, false),
    };
    if let Some(notification) = first {
        words.extend(notification.payload().split_whitespace().map(str::to_owned));
        let mut buffered = notifications.iter();
        loop {
            match buffered.next() {
                Ok(Some(notification)) => {
                    words.extend(notification.payload().split_whitespace().map(str::to_owned));
                    if words.len() > 10_000 {
                        break;
                    }
                }
                Ok(None) => break,
                Err(_) => return (words, false),
            }
        }
    }
    (words, true)
}
