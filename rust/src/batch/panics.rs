//! A pipeline thread's panic as a message and as the fault that fails the pass: a bug met on
//! some input must not end an epoch early (in DDP, one rank stopping early hangs the others).

pub(super) use crate::error::panic_message;
use crate::error::{Fault, Reason, SourceKind};

/// A fault for a pipeline thread that panicked: the pass fails with it instead of ending early.
pub(super) fn panic_fault(thread: &str, panic: &(dyn std::any::Any + Send)) -> Fault {
    Fault {
        reason: Reason::Internal,
        url: String::new(),
        key: String::new(),
        detail: format!(
            "the {thread} thread panicked ({}): this pass cannot finish; please report it",
            panic_message(panic)
        ),
        kind: SourceKind::Other,
    }
}
