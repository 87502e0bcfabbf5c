//! The multi-process tests' child processes: this test binary run again on one of its ignored
//! tests (the child's body), its settings in environment variables, its commands on its
//! standard input, its lines read back on a channel.

// Each test binary uses only some of these helpers.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

/// Starts this test binary on the ignored test `test` with `envs`: the child, its standard
/// input, and the lines it prints.
pub fn spawn(test: &str, envs: &[(&str, String)]) -> (Child, ChildStdin, Receiver<String>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", test, "--nocapture"])
        .args(["--test-threads", "1"])
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start a child process ({test}): {e}"));
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = crossbeam_channel::unbounded();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    (child, stdin, lines)
}

/// The first line of `lines` that ends with `wanted`, within 30 s (the test harness may print
/// "test <name> ... " before it on the line).
pub fn expect_line(lines: &Receiver<String>, wanted: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.trim().ends_with(wanted) => return line,
            Ok(_) => {}
            Err(_) => panic!("the child process never printed {wanted:?}"),
        }
    }
}
