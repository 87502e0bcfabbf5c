//! The dashboard's server: a [`Dashboard`] is configured, then started on its own threads
//! (`tiny_http`, a blocking server: no async runtime in a project that has none), and stopped.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::history::{History, Sample};
use super::routes;
use super::security;
use super::source::Source;

/// Threads that answer requests.
const THREADS: usize = 4;

/// Why the dashboard would not start.
///
/// # Examples
///
/// ```
/// use tasq_console::web::WebError;
/// let error = WebError::TokenRequired("0.0.0.0:8080".parse().unwrap());
/// assert!(error.to_string().contains("access token"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebError {
    /// The address is not a loopback one, and no access token was given.
    #[error(
        "{0} is not a loopback address: anyone who can reach it could change the queue; give an access token (--token or TASQ_WEB_TOKEN), or bind to 127.0.0.1"
    )]
    TokenRequired(SocketAddr),
    /// The address does not parse or resolve.
    #[error("the address {0:?} is not one to listen on")]
    BadAddress(String),
    /// The address could not be bound (in use, or not this machine's).
    #[error("could not listen on {0}: {1}")]
    Bind(SocketAddr, String),
}

/// How the server answers: what [`routes`] needs of it.
pub(crate) struct Shared {
    pub(crate) source: Box<dyn Source>,
    pub(crate) history: History,
    pub(crate) token: Option<String>,
    pub(crate) csrf: String,
    pub(crate) read_only: bool,
    pub(crate) bound: SocketAddr,
    pub(crate) refresh: Option<Duration>,
}

/// A dashboard for one queue, to configure and start.
///
/// # Examples
///
/// ```no_run
/// use tasq_console::web::Dashboard;
/// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
/// let running = Dashboard::new(admin).bind("127.0.0.1:8080").start()?;
/// println!("the dashboard is at http://{}", running.addr());
/// running.wait();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Dashboard {
    source: Box<dyn Source>,
    bind: String,
    token: Option<String>,
    read_only: bool,
    sample_every: Duration,
    refresh: Option<Duration>,
}

impl Dashboard {
    /// A dashboard of `source` (an [`Admin`](tasq::postgres::Admin) of a durable queue), on
    /// 127.0.0.1:8080 unless [`bind`](Dashboard::bind) says otherwise.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// let dashboard = tasq_console::web::Dashboard::new(admin);
    /// # let _ = dashboard;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(source: impl Source) -> Dashboard {
        Dashboard {
            source: Box::new(source),
            bind: "127.0.0.1:8080".to_owned(),
            token: None,
            read_only: false,
            sample_every: Duration::from_secs(10),
            refresh: Some(Duration::from_secs(10)),
        }
    }

    /// Listens on `addr` (`host:port`; port 0 picks a free one). Any address but a loopback
    /// one needs an access token.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// let dashboard = tasq_console::web::Dashboard::new(admin).bind("127.0.0.1:0");
    /// # let _ = dashboard;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bind(mut self, addr: impl Into<String>) -> Dashboard {
        self.bind = addr.into();
        self
    }

    /// Requires `token` of every request (as `/?token=...` once, then a cookie, or an
    /// `Authorization: Bearer` header). Required to listen on any address but a loopback one.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// let dashboard = tasq_console::web::Dashboard::new(admin)
    ///     .bind("0.0.0.0:8080")
    ///     .token(tasq_console::web::random_token());
    /// # let _ = dashboard;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn token(mut self, token: impl Into<String>) -> Dashboard {
        let token = token.into();
        self.token = (!token.is_empty()).then_some(token);
        self
    }

    /// Shows the queue without any button: no request can change it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// let dashboard = tasq_console::web::Dashboard::new(admin).read_only(true);
    /// # let _ = dashboard;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn read_only(mut self, read_only: bool) -> Dashboard {
        self.read_only = read_only;
        self
    }

    /// How often the plots' figures are sampled (10 seconds unless set; the last 360 kept).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// let dashboard = tasq_console::web::Dashboard::new(admin)
    ///     .sample_every(std::time::Duration::from_secs(5));
    /// # let _ = dashboard;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sample_every(mut self, every: Duration) -> Dashboard {
        self.sample_every = every.max(Duration::from_millis(10));
        self
    }

    /// How often the overview reloads itself (every 10 seconds unless set; `None`: never).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// let dashboard = tasq_console::web::Dashboard::new(admin).refresh_every(None);
    /// # let _ = dashboard;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refresh_every(mut self, every: Option<Duration>) -> Dashboard {
        self.refresh = every;
        self
    }

    /// Starts serving on threads of its own.
    ///
    /// # Errors
    ///
    /// [`WebError::TokenRequired`] for a non-loopback address without a token,
    /// [`WebError::BadAddress`] or [`WebError::Bind`] when it cannot listen.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// let running = tasq_console::web::Dashboard::new(admin).bind("127.0.0.1:0").start()?;
    /// running.stop();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn start(self) -> Result<Running, WebError> {
        let addr = self
            .bind
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.next())
            .ok_or_else(|| WebError::BadAddress(self.bind.clone()))?;
        if !addr.ip().is_loopback() && self.token.is_none() {
            return Err(WebError::TokenRequired(addr));
        }
        let server =
            tiny_http::Server::http(addr).map_err(|e| WebError::Bind(addr, e.to_string()))?;
        let bound = server.server_addr().to_ip().unwrap_or(addr);
        let server = Arc::new(server);
        let shared = Arc::new(Shared {
            source: self.source,
            history: History::default(),
            token: self.token,
            csrf: security::random_token(),
            read_only: self.read_only,
            bound,
            refresh: self.refresh,
        });
        let stopping = Arc::new((Mutex::new(false), Condvar::new()));
        let stopped = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for i in 0..THREADS {
            let server = server.clone();
            let shared = shared.clone();
            let stopped = stopped.clone();
            let thread = std::thread::Builder::new()
                .name(format!("tasq-web-{i}"))
                .spawn(move || {
                    while !stopped.load(Ordering::SeqCst) {
                        match server.recv() {
                            Ok(request) => routes::answer(&shared, request),
                            // Unblocked to stop, or a connection that failed to open.
                            Err(_) => continue,
                        }
                    }
                })
                .expect("spawn a dashboard thread");
            threads.push(thread);
        }
        let sampler = {
            let shared = shared.clone();
            let stopping = stopping.clone();
            let every = self.sample_every;
            std::thread::Builder::new()
                .name("tasq-web-sampler".to_owned())
                .spawn(move || {
                    let (lock, wake) = &*stopping;
                    let mut stop = lock.lock().unwrap_or_else(|e| e.into_inner());
                    while !*stop {
                        drop(stop);
                        if let Ok(overview) = shared.source.overview() {
                            shared.history.push(Sample::of(&overview));
                        }
                        stop = lock.lock().unwrap_or_else(|e| e.into_inner());
                        // Until the next sample is due, or a stop.
                        let deadline = std::time::Instant::now() + every;
                        while !*stop {
                            let left =
                                deadline.saturating_duration_since(std::time::Instant::now());
                            if left.is_zero() {
                                break;
                            }
                            stop = wake
                                .wait_timeout(stop, left)
                                .unwrap_or_else(|e| e.into_inner())
                                .0;
                        }
                    }
                })
                .expect("spawn the sampler thread")
        };
        threads.push(sampler);
        Ok(Running {
            addr: bound,
            server,
            threads,
            stopped,
            stopping,
        })
    }
}

/// A dashboard serving; [`stop`](Running::stop) ends it (dropping it does too).
///
/// # Examples
///
/// ```no_run
/// # let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
/// let running = tasq_console::web::Dashboard::new(admin).bind("127.0.0.1:0").start()?;
/// let url = format!("http://{}/", running.addr());
/// # let _ = url;
/// running.stop();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Running {
    addr: SocketAddr,
    server: Arc<tiny_http::Server>,
    threads: Vec<JoinHandle<()>>,
    stopped: Arc<AtomicBool>,
    stopping: Arc<(Mutex<bool>, Condvar)>,
}

impl Running {
    /// The address it listens on (the port chosen, if 0 was asked for).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// let running = tasq_console::web::Dashboard::new(admin).bind("127.0.0.1:0").start()?;
    /// assert_ne!(running.addr().port(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until the process ends.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// tasq_console::web::Dashboard::new(admin).start()?.wait();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait(mut self) {
        for thread in std::mem::take(&mut self.threads) {
            let _ = thread.join();
        }
    }

    /// Stops serving: the requests being answered are answered, then its threads end.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// tasq_console::web::Dashboard::new(admin).bind("127.0.0.1:0").start()?.stop();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
        for _ in 0..THREADS {
            self.server.unblock();
        }
        let (lock, wake) = &*self.stopping;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        wake.notify_all();
        for thread in std::mem::take(&mut self.threads) {
            let _ = thread.join();
        }
    }
}
