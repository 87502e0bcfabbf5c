//! Why a command failed, and the exit code a script sees for it.

use std::fmt;

/// A command's failure: its message (one line for a person) and its kind (the exit code).
#[derive(Debug)]
pub struct Failure {
    /// What went wrong, as a person reads it.
    pub message: String,
    /// Which exit code it gives.
    pub kind: Kind,
}

/// The kinds of failure, one exit code each (listed in `tasq --help`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The database failed during the command: 1.
    Db,
    /// A bad argument: 2 (clap's own code for bad usage).
    Usage,
    /// No such task: 3.
    NotFound,
    /// The task is not in a state the action takes: 4.
    Refused,
    /// The queue cannot be reached: 5.
    Unreachable,
}

impl Failure {
    /// A failure of `kind` saying `message`.
    pub fn new(kind: Kind, message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            kind,
        }
    }

    /// The process's exit code.
    pub fn code(&self) -> u8 {
        match self.kind {
            Kind::Db => 1,
            Kind::Usage => 2,
            Kind::NotFound => 3,
            Kind::Refused => 4,
            Kind::Unreachable => 5,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<tasq::postgres::AdminError> for Failure {
    fn from(error: tasq::postgres::AdminError) -> Failure {
        use tasq::postgres::AdminError;
        let kind = match &error {
            AdminError::Db(_) => Kind::Db,
            AdminError::Setting(_) => Kind::Usage,
            _ => Kind::Unreachable,
        };
        Failure::new(kind, error.to_string())
    }
}

impl From<tasq::ResubmitError> for Failure {
    fn from(error: tasq::ResubmitError) -> Failure {
        use tasq::ResubmitError;
        let kind = match &error {
            ResubmitError::UnknownTask(_) => Kind::NotFound,
            ResubmitError::Store(..) => Kind::Db,
            _ => Kind::Refused,
        };
        Failure::new(kind, error.to_string())
    }
}

impl From<tasq::CancelError> for Failure {
    fn from(error: tasq::CancelError) -> Failure {
        use tasq::CancelError;
        let kind = match &error {
            CancelError::UnknownTask(_) | CancelError::UnknownKey(_) => Kind::NotFound,
            _ => Kind::Db,
        };
        Failure::new(kind, error.to_string())
    }
}

impl From<tasq::PauseError> for Failure {
    fn from(error: tasq::PauseError) -> Failure {
        let kind = match &error {
            tasq::PauseError::InvalidName { .. } => Kind::Usage,
            _ => Kind::Db,
        };
        Failure::new(kind, error.to_string())
    }
}

impl From<tasq::QueueLimitError> for Failure {
    fn from(error: tasq::QueueLimitError) -> Failure {
        let kind = match &error {
            tasq::QueueLimitError::Store(_) => Kind::Db,
            _ => Kind::Usage,
        };
        Failure::new(kind, error.to_string())
    }
}
