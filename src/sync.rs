//! Locking the limiter's own state.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks a mutex of the limiter's own state. None is held across user code
/// or an await, and every write leaves its data whole (plain values), so a
/// lock poisoned by a panic elsewhere is still usable: the request path
/// never panics on it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
