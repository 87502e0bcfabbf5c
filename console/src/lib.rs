//! The operator's console of [`tasq`]: the dashboard, which the `tasq web` command serves and
//! a program can serve itself, beside its pool.
//!
//! ```no_run
//! use tasq_console::web::Dashboard;
//! let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
//! let running = Dashboard::new(admin).bind("127.0.0.1:8080").start()?;
//! println!("http://{}/", running.addr());
//! running.wait();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod web;
