//! A worker thread's loop: claim a task, run its handler (never under the lock), classify the
//! result, complete the task.

use std::any::Any;

use rand::Rng;

use crate::context::Context;
use crate::registry::Entry;
use crate::retry::HandlerError;
use crate::store::{RunOutcome, Store};
use crate::task::FailureReason;
use crate::unwind;

/// Runs tasks from `store` until it says to stop.
pub(crate) fn run<S: Store + ?Sized, R: Rng>(store: &S, rng: &mut R) {
    let mut next = store.claim(None);
    while let Some(claim) = next {
        let entry = store.registry().entry(claim.type_index);
        let ctx = Context::new(claim.id, claim.attempt, entry.name, claim.token.clone());
        let result = unwind::catch(|| (entry.handler)(&ctx, &*claim.payload));
        let token = ctx.into_token();
        let outcome = classify(result, claim.attempt, entry, rng);
        next = store.complete_and_claim(claim, outcome, token);
    }
}

/// Turns a handler's result into what the store records: success, a retry after a drawn
/// backoff, or a dead letter (a permanent error, a panic, or the last attempt failing).
fn classify<R: Rng>(
    result: Result<Result<Box<dyn Any + Send + Sync>, HandlerError>, String>,
    attempt: u32,
    entry: &Entry,
    rng: &mut R,
) -> RunOutcome {
    match result {
        Ok(Ok(output)) => RunOutcome::Succeeded(output),
        Ok(Err(error)) if error.is_permanent() => RunOutcome::Failed {
            reason: FailureReason::Permanent,
            error: error.to_string(),
        },
        Ok(Err(error)) if attempt >= entry.max_attempts => RunOutcome::Failed {
            reason: FailureReason::Exhausted,
            error: error.to_string(),
        },
        Ok(Err(error)) => RunOutcome::Retry {
            delay: entry.retry.delay(attempt, rng),
            error: error.to_string(),
        },
        Err(panic_message) => RunOutcome::Failed {
            reason: FailureReason::Panicked,
            error: panic_message,
        },
    }
}
