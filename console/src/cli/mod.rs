//! The `tasq` command: its arguments, the subcommands run against the queue, what they
//! print, and the exit codes of their failures.

pub mod args;
pub mod failure;
pub mod render;
pub mod run;
