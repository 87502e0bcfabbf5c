//! The operator's console of [`tasq`]: the dashboard, which the `tasq web` command serves and
//! a program can serve itself, of a durable queue or of its own pool on either store.
//!
//! ```no_run
//! use tasq_console::web::Dashboard;
//! let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
//! let running = Dashboard::new(admin).bind("127.0.0.1:8080").start()?;
//! println!("http://{}/", running.addr());
//! running.wait();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A pool in the program's own process, shared with the dashboard as an `Arc<Pool>`:
//!
//! ```no_run
//! use std::sync::Arc;
//! use tasq::{HandlerError, Pool, TaskType};
//! use tasq_console::web::Dashboard;
//!
//! const RESIZE: TaskType<u32, u32> = TaskType::new("resize");
//! let pool = Arc::new(
//!     Pool::builder()
//!         .register(RESIZE, |_, width: &u32| Ok::<_, HandlerError>(width / 2))
//!         .build()?,
//! );
//! let dashboard = Dashboard::new(Arc::clone(&pool)).start()?; // http://127.0.0.1:8080/
//! pool.submit(RESIZE.task(640))?;
//! # dashboard.stop();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod web;
