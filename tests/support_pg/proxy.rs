//! A TCP proxy in front of the server that can cut every connection through it at once, with
//! no word from the server: each side sees its peer close (as after a network reset, or a
//! server machine restarting), where `pg_terminate_backend` sends a farewell message first.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// The proxy; it stops accepting when dropped (its open connections are cut then too).
pub struct Proxy {
    port: u16,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    /// A proxy on a free loopback port, forwarding to `host:port`.
    pub fn start(host: &str, port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let local = listener.local_addr().unwrap().port();
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let target = format!("{host}:{port}");
        let kept = Arc::downgrade(&open);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Some(open) = kept.upgrade() else { return };
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                {
                    let mut open = open.lock().unwrap();
                    open.push(client.try_clone().unwrap());
                    open.push(server.try_clone().unwrap());
                }
                pump(client.try_clone().unwrap(), server.try_clone().unwrap());
                pump(server, client);
            }
        });
        Proxy { port: local, open }
    }

    /// The port to connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Cuts every connection open through the proxy, both ways; returns how many.
    pub fn cut(&self) -> usize {
        let mut open = self.open.lock().unwrap();
        for stream in open.iter() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        let cut = open.len() / 2;
        open.clear();
        cut
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        // Wakes the accepting thread, which then finds the proxy gone.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Copies `from` to `to` on a thread of its own until either side ends.
fn pump(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let mut buffer = [0; 16 * 1024];
        loop {
            match from.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}
